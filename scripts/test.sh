#!/usr/bin/env bash
# Runs the test suite against real services: makes sure PostgreSQL and MariaDB
# are up (starting the machine's own servers if they are not), then runs
# cargo nextest. Extra arguments go to nextest (e.g. a test filter).
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

# promtool, amtool, Prometheus and Alertmanager for the alerting tests.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus-alertmanager >/dev/null 2>&1; then
  echo "Installing prometheus and prometheus-alertmanager (Debian packages)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
fi

# Headless Chromium (Debian package) for the page tests (tests/pages.rs).
if ! command -v chromium >/dev/null 2>&1; then
  echo "Installing chromium (Debian package)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# kubernetes-validate (PyPI; bundles its schemas, works offline) for the manifest tests.
if ! command -v kubernetes-validate >/dev/null 2>&1 && ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "Installing kubernetes-validate (PyPI)..."
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore 'kubernetes-validate==1.37.0'
fi

# tansu, a Kafka-protocol broker, for the Kafka tests: each test starts its own
# (in-memory storage, a free port). Built once (about 8 minutes) and cached.
TANSU="${TANSU:-$HOME/.cargo/bin/tansu}"
if [ ! -x "$TANSU" ]; then
  echo "Installing tansu 0.6.0 (cargo install, once)..."
  cargo install tansu --version 0.6.0 --locked --features dynostore
fi
export TANSU

# Node.js and the npm packages of tests/libraries.rs and tests/preset_pgboss.rs: real
# pg-transactional-outbox, graphile-worker and pg-boss writing their own tables, at the
# exact versions of
# tests/libraries/package-lock.json (npm ci; again when the lock file changes).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "Installing nodejs and npm (Debian packages)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -d tests/libraries/node_modules ] \
  || [ tests/libraries/package-lock.json -nt tests/libraries/node_modules/.package-lock.json ]; then
  echo "Installing the npm packages of tests/libraries (npm ci)..."
  npm ci --prefix tests/libraries --no-audit --no-fund
fi

# The apalis workloads of tests/preset_apalis.rs: apalis-postgres and apalis-mysql from
# crates.io at the versions of their own Cargo.lock files (two projects: the crates
# need two semver-compatible versions of apalis-core), built into one target directory
# of their own. Cargo rebuilds only what changed: about 2 minutes on 2 cores the first
# time, under a second after that.
for crate in postgres mysql; do
  cargo build --quiet --locked --manifest-path "tests/libraries/apalis/$crate/Cargo.toml" \
    --target-dir tests/libraries/apalis/target
done

if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi
exec cargo nextest run --no-fail-fast "$@"
