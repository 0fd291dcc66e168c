FROM debian:12
WORKDIR /src
COPY . /src
RUN bash tools/install-deps.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DWM_BUILD_CUDA=OFF -DWM_NATIVE=OFF \
    && cmake --build build -j"$(nproc)"
EXPOSE 50051 9464
CMD ["bash", "tools/demo.sh"]
