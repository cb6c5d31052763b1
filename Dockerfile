# The inboxwatch agent image.
#   docker build -t registry.example.com/inboxwatch:0.1.0 .
# Runtime: Debian slim with the binary, a non-root user (uid 10001) and the
# dashboards, alert rules and example configs under /usr/share/inboxwatch/.
# TLS to the databases uses rustls with built-in roots: no CA bundle needed.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# benches/ because the manifest names its [[bench]] targets, and cargo resolves
# every target's file before it builds any (tests/image.rs checks this stage).
COPY src ./src
COPY benches ./benches
# The presets are compiled into the binary (include_str!).
COPY presets ./presets
# The dist profile (Cargo.toml): the build scripts/bench.sh measures.
RUN cargo build --profile dist --locked --bin inboxwatch

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 inboxwatch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin inboxwatch
COPY --from=build /src/target/dist/inboxwatch /usr/local/bin/inboxwatch
COPY dashboards/ /usr/share/inboxwatch/dashboards/
COPY alerts/ /usr/share/inboxwatch/alerts/
COPY config/ /usr/share/inboxwatch/config/
USER 10001:10001
EXPOSE 9469
ENTRYPOINT ["inboxwatch"]
CMD ["run", "--config", "/etc/inboxwatch/inboxwatch.toml"]
