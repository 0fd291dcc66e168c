// A browser front end for wmserve (`wmplay --web`): an HTTP server that
// gives a page, opens one Play session per player on wmserve, shows its
// frames as an MJPEG stream and turns the page's keyboard and mouse state
// into fixed-rate actions.
//
//   GET  /                  the page
//   POST /players?seed=N    opens a session; JSON: id, frame size, fps, the
//                           model's keys and mouse limit (503 when every
//                           player slot is taken, 502 with wmserve's
//                           message when the server refuses)
//   GET  /stream?id=ID      the session's frames, multipart/x-mixed-replace;
//                           the session ends when this response ends
//   POST /input?id=ID       body "KEYS DX DY": the keys held now (a bit mask
//                           in the model's key order) and mouse movement
//                           since the last post; the next action carries them
//   GET  /stats?id=ID       JSON: frames, fps (last 2 s), latency_ms_p50/p95
//                           (action to frame, last 256 frames, wmplay's
//                           clock), frames_dropped, deadline_missed
//
// A player whose page never opens its stream ends after attach_timeout_s.
#pragma once

#include <string>

#include "clients/play_client.h"

namespace wm::client {

struct WebPlayerOptions {
  std::string server = "localhost:50051";  // wmserve
  ChannelOptions channel;                  // how to reach it (TLS)
  std::string listen = "127.0.0.1:8080";   // host:port of the page; port 0 picks a free one
  std::string port_file;                   // {"port": P} is written here once listening
  double fps = 20;                         // the fixed rate players ask wmserve for
  std::string model;                       // "" = the server's
  std::string format;                      // "" = the server's default cache format
  int quality = 0;                         // JPEG quality, 0 = the server's
  int max_players = 4;
  double attach_timeout_s = 10;
};

// serves until SIGINT or SIGTERM; the process exit code
int run_web_player(const WebPlayerOptions& options);

}  // namespace wm::client
