// The page wmplay --web serves (clients/web_player.h): shows a session's
// MJPEG stream and posts the keyboard and mouse state at the session's rate.
#pragma once

namespace wm::client {

inline constexpr char kWebPlayerPage[] = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>wmserve player</title>
<style>
  body { background: #111; color: #ddd; font: 14px sans-serif; margin: 24px; }
  #view { width: 512px; height: 512px; image-rendering: pixelated; background: #000; display: block;
          margin: 12px 0; cursor: crosshair; outline: 1px solid #333; }
  #view.locked { outline: 2px solid #6a6; }
  button, input { font: inherit; }
  #keys span { display: inline-block; min-width: 1.6em; text-align: center; margin-right: 4px;
               border: 1px solid #555; border-radius: 3px; padding: 1px 3px; }
  #keys span.on { background: #6a6; color: #000; }
  .muted { color: #888; }
</style>
</head>
<body>
<div>
  <button id="play">Play</button>
  seed <input id="seed" type="number" min="0" value="1" style="width: 7em">
  <button id="stop">Stop</button>
  <span id="status" class="muted">press Play</span>
</div>
<div id="stats" class="muted"></div>
<img id="view" alt="">
<div id="keys"></div>
<p class="muted">Click the picture to steer with the mouse (Esc lets it go); hold the model's keys to move.</p>
<script>
"use strict";
const view = document.getElementById("view"), statusLine = document.getElementById("status");
const keysBox = document.getElementById("keys"), statsLine = document.getElementById("stats");
const SENSITIVITY = 0.15;  // action mouse units per pixel of movement
let player = null, timer = null, statsTimer = null, held = 0, dx = 0, dy = 0, bits = {};

function say(text) { statusLine.textContent = text; }

function showKeys() {
  keysBox.innerHTML = "";
  if (!player) return;
  player.keys.forEach((k, i) => {
    const s = document.createElement("span");
    s.textContent = k;
    if (held & (1 << i)) s.className = "on";
    keysBox.appendChild(s);
  });
}

function stop() {
  if (timer) clearInterval(timer);
  if (statsTimer) clearInterval(statsTimer);
  timer = null;
  statsTimer = null;
  statsLine.textContent = "";
  player = null;
  view.removeAttribute("src");  // closing the stream ends the session
  held = 0; dx = 0; dy = 0;
  showKeys();
}

async function play() {
  stop();
  say("starting...");
  let r, j;
  try {
    r = await fetch("/players?seed=" + encodeURIComponent(document.getElementById("seed").value), {method: "POST"});
    j = await r.json();
  } catch (e) {
    say("wmplay is not answering: " + e);
    return;
  }
  if (!r.ok) { say(j.error || ("HTTP " + r.status)); return; }
  player = j;
  bits = {};
  player.keys.forEach((k, i) => { bits[k.toUpperCase()] = 1 << i; });
  view.style.aspectRatio = player.width + " / " + player.height;
  view.style.height = (512 * player.height / player.width) + "px";
  view.src = "/stream?id=" + encodeURIComponent(player.id);
  say(player.model + ", " + player.width + "x" + player.height + ", seed " + player.seed + ", " +
      player.cache_format + " cache, " + player.fps + " frames/s");
  showKeys();
  timer = setInterval(send, 1000 / player.fps);
  statsTimer = setInterval(showStats, 1000);
}

// frames/s as they arrive and how long an action takes to come back as a frame
function showStats() {
  if (!player) return;
  const id = player.id;
  fetch("/stats?id=" + encodeURIComponent(id)).then(r => r.ok ? r.json() : null).then(s => {
    if (!s || !player || player.id !== id) return;
    statsLine.textContent = s.fps.toFixed(1) + " frames/s, action to frame p50 " + s.latency_ms_p50.toFixed(0) +
        " ms, p95 " + s.latency_ms_p95.toFixed(0) + " ms; " + s.frames + " frames, " + s.frames_dropped +
        " dropped, " + s.deadline_missed + " late";
  }).catch(() => {});
}

function send() {
  if (!player) return;
  const body = held + " " + dx.toFixed(3) + " " + (-dy).toFixed(3);  // mouse up looks up
  dx = 0; dy = 0;
  fetch("/input?id=" + encodeURIComponent(player.id), {method: "POST", body}).then(r => {
    if (r.status === 404 && player) { say("the session ended"); stop(); }
  }).catch(() => {});
}

function keyName(e) { return e.code && e.code.startsWith("Key") ? e.code.slice(3) : e.key.toUpperCase(); }

document.addEventListener("keydown", e => {
  const b = bits[keyName(e)];
  if (player && b) { held |= b; showKeys(); e.preventDefault(); }
});
document.addEventListener("keyup", e => {
  const b = bits[keyName(e)];
  if (player && b) { held &= ~b; showKeys(); e.preventDefault(); }
});
window.addEventListener("blur", () => { held = 0; showKeys(); });
view.addEventListener("click", () => { if (player) view.requestPointerLock(); });
document.addEventListener("pointerlockchange", () => {
  view.classList.toggle("locked", document.pointerLockElement === view);
});
document.addEventListener("mousemove", e => {
  if (document.pointerLockElement !== view) return;
  dx += e.movementX * SENSITIVITY;
  dy += e.movementY * SENSITIVITY;
});
view.addEventListener("error", () => { if (player) { say("the stream ended"); stop(); } });
document.getElementById("play").addEventListener("click", play);
document.getElementById("stop").addEventListener("click", () => { stop(); say("stopped"); });
</script>
</body>
</html>
)html";

}  // namespace wm::client
