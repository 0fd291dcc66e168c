FROM debian:12
WORKDIR /src
COPY . /src
RUN bash tools/install-deps.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DWM_BUILD_CUDA=OFF -DWM_NATIVE=OFF \
    && cmake --build build -j"$(nproc)"
# OpenMP workers that spin between loops starve the server's other threads
# (docs/PERFORMANCE.md); libgomp reads this before wmserve's main
ENV OMP_WAIT_POLICY=passive
EXPOSE 50051 9464
CMD ["bash", "tools/demo.sh"]
