#!/usr/bin/env bash
# The table-source benchmark (docs/performance.md): inboxwatch against
# prometheus-sql-exporter on the same inbox table, side by side.
#
#   scripts/bench.sh            PostgreSQL 10 M rows (polls every 5 s and every 1 s) and
#                               1 M rows, MariaDB 1 M rows, each mode of cursor; writes
#                               the tables into docs/performance.md
#   scripts/bench.sh --ci       PostgreSQL and MariaDB side by side, 100 k rows, 30 s, debug build,
#                               cursor = "updated_at" and "none";
#                               fails if a counter is not exact or P95 is off by > 1 %;
#                               writes nothing into the repository
#   scripts/bench.sh --soak     the memory soak on PostgreSQL: two agents (dist build)
#                               with a short and a long state_retention under a steady
#                               writer, then a block of unfinished rows; bytes per
#                               remembered and per tracked event (about 8 minutes);
#                               writes its table into docs/performance.md
#   scripts/bench.sh --growth   cursor = "none" at 2 M rows with 1 k, 10 k, 100 k and 1 M
#                               unfinished rows (2000 changes/s, 1 s polls, 60 s each,
#                               max_tracked_events = 2 M so that every level keeps its
#                               backlog) on PostgreSQL and MariaDB: the per-poll cost
#                               against the backlog; writes its table into
#                               docs/performance.md
#   scripts/bench.sh --tracing  the span linker's two measurements (the ignored tests of
#                               tests/tracing.rs, release build, on the test services'
#                               PostgreSQL at 127.0.0.1:5432): spans per agent CPU-second
#                               and RSS with the collector down; fails beyond their bounds;
#                               writes its table into docs/performance.md (the full run
#                               does this too, after the table runs)
#
# Environment: RATE (changes/s, default 2000), POLL (refresh interval in
# seconds, default 5), SECONDS_RUN (writer run, default 120), PG_ROWS
# ("10000000 10000000:1 1000000 10000000:1:none 1000000:5:none": rows,
# optionally :refresh interval, optionally :none for the agent without the
# updated_at column, i.e. cursor = "none", on the same table and writer),
# MY_ROWS ("1000000 1000000:5:none"; the same form; a spec may add :unfinished
# rows, :rate and :max_tracked_events, e.g. "1000000:1:none:20000:200"), BLOCK (the
# results block written). --soak: RATE defaults to 1000 (about 300
# completions/s), SOAK_RETENTIONS ("30,240" seconds), SOAK_BACKLOG (unfinished
# rows added, 100000), SOAK_WINDOW (samples per plateau, 60). AGENT_BIN: the
# agent binary to measure, in both modes (default the dist build of this
# tree), e.g. another commit's for a comparison in the same conditions.
# MY_GENERAL_LOG=0: mariadbd without its general query log, which is on
# (written nowhere) so that the agent's plans can be taken at the end.
# MY_SLOW_LOG: a path where MariaDB's log of every statement is kept (slow
# query log at 0 s: it slows every statement a little, the exporter's too);
# `scripts/slowlog-statements.py PATH` sums the agent's time per statement.
#
# Every database is the benchmark's own: a PostgreSQL 15 cluster (initdb,
# pg_stat_statements preloaded, and auto_explain, off until the harness takes
# the agent's plans after the measured window) and a mariadbd instance
# (performance_schema on), each on a free port in a temporary directory
# removed at the end.
# prometheus-sql-exporter is installed from Debian if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

CI=0; SOAK=0; TRACING=0; GROWTH=0
MODE=${1:-}
case "$MODE" in
  "") ;;
  --ci) CI=1 ;;
  --growth) GROWTH=1 ;;
  --soak) SOAK=1; RATE=${RATE:-1000} ;;
  --tracing) TRACING=1 ;;
  *) echo "error: unknown option '$1' (expected --ci, --soak, --growth, --tracing or none)" >&2; exit 2 ;;
esac
RATE=${RATE:-2000}
POLL=${POLL:-5}
# The block of docs/performance.md the full run rewrites (another name keeps
# the main results, e.g. BLOCK=none for the cursor-less targets' run).
BLOCK_SET=${BLOCK:+1}
BLOCK=${BLOCK:-bench}
if [ $GROWTH = 1 ]; then
  SECONDS_RUN=${SECONDS_RUN:-60}
  levels="1000 10000 100000 1000000"
  PG_ROWS=${PG_ROWS:-$(for u in $levels; do printf '2000000:1:none:%s::2000000 ' "$u"; done)}
  MY_ROWS=${MY_ROWS:-$(for u in $levels; do printf '2000000:1:none:%s::2000000 ' "$u"; done)}
elif [ $CI = 1 ]; then
  SECONDS_RUN=${SECONDS_RUN:-30}; PG_ROWS=${PG_ROWS:-"100000 100000:5:none"}; MY_ROWS=${MY_ROWS:-"100000 100000:5:none"}
else
  SECONDS_RUN=${SECONDS_RUN:-120}
  PG_ROWS=${PG_ROWS:-"10000000 10000000:1 1000000 10000000:1:none 1000000:5:none"}
  MY_ROWS=${MY_ROWS:-"1000000 1000000:5:none"}
fi
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}

if [ $SOAK = 0 ] && [ $TRACING = 0 ] && ! command -v prometheus-sql-exporter >/dev/null 2>&1; then
  echo "Installing prometheus-sql-exporter (Debian package)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus-sql-exporter >/dev/null
fi

WORK=$(mktemp -d /tmp/inboxwatch-bench.XXXXXX)
chmod 755 "$WORK"
PG_PID= ; MY_PID=
cleanup() {
  if [ -n "$PG_PID" ]; then runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg" -m fast -w stop >/dev/null 2>&1 || true; fi
  if [ -n "$MY_PID" ]; then kill "$MY_PID" 2>/dev/null || true; wait "$MY_PID" 2>/dev/null || true; fi
  if [ -n "${MY_SLOW_LOG:-}" ] && [ -f "$WORK/my/slow.log" ]; then cp "$WORK/my/slow.log" "$MY_SLOW_LOG"; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
as_owner() { # user, command...: run as `user` when root (PostgreSQL refuses to run as root)
  local u=$1; shift
  if [ "$(id -u)" = 0 ]; then runuser -u "$u" -- "$@"; else "$@"; fi
}

start_pg() {
  PG_PORT=$(free_port)
  mkdir -p "$WORK/pg"
  [ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
  as_owner postgres "$PGBIN/initdb" -D "$WORK/pg" -U postgres -A trust -E UTF8 --no-sync >/dev/null
  local mem=1GB; [ $CI = 1 ] && mem=256MB
  cat >> "$WORK/pg/postgresql.conf" <<CONF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$WORK/pg'
shared_preload_libraries = 'pg_stat_statements, auto_explain'
pg_stat_statements.track = top
pg_stat_statements.track_planning = on
shared_buffers = $mem
max_wal_size = 8GB
checkpoint_timeout = 30min
CONF
  as_owner postgres "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/server.log" -w start >/dev/null
  PG_PID=$(head -n1 "$WORK/pg/postmaster.pid")
}

start_mariadb() {
  MY_PORT=$(free_port)
  mkdir -p "$WORK/my"
  [ "$(id -u)" = 0 ] && chown mysql "$WORK/my"
  mariadb-install-db --no-defaults --user=mysql --datadir="$WORK/my" \
    --auth-root-authentication-method=normal --skip-test-db >/dev/null
  local mem=1G; [ $CI = 1 ] && mem=256M
  # MY_SLOW_LOG: every statement into the slow query log (kept at that path),
  # for scripts/slowlog-statements.py: MariaDB's performance_schema counts
  # no executions of prepared statements, so the agent's time per statement
  # is read from there.
  # The general query log is on from the start, written nowhere: MariaDB
  # writes a prepared statement's values into its logged text only when a log
  # was on as the statement was prepared, and the harness reads the agent's
  # statements, values and all, from it after the measured window
  # (benches/table/plans.rs).
  # MY_GENERAL_LOG=0 leaves it off (what it costs; the report then has no
  # MariaDB plans).
  local general=1; [ "${MY_GENERAL_LOG:-1}" = 0 ] && general=0
  local slow=(--general-log=$general --log-output=NONE)
  [ -n "${MY_SLOW_LOG:-}" ] && slow=(--general-log=$general --general-log-file=/dev/null --log-output=FILE
    --slow-query-log=1 --long-query-time=0 --slow-query-log-file="$WORK/my/slow.log")
  mariadbd --no-defaults --user=mysql --datadir="$WORK/my" --port="$MY_PORT" --bind-address=127.0.0.1 \
    --socket="$WORK/my/mysqld.sock" --pid-file="$WORK/my/mysqld.pid" --performance-schema=ON \
    --innodb-buffer-pool-size=$mem --innodb-log-file-size=1G --innodb-flush-log-at-trx-commit=1 \
    --log-error="$WORK/my/error.log" "${slow[@]}" &
  MY_PID=$!
  for _ in $(seq 1 60); do
    mariadb-admin -h 127.0.0.1 -P "$MY_PORT" -u root ping >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "error: mariadbd did not start; $WORK/my/error.log:" >&2
  cat "$WORK/my/error.log" >&2
  return 1
}

if [ $CI = 1 ]; then
  # The test profile's build, shared with the test suite.
  run_bench() { cargo test --quiet --bench table -- "$@" --check; }
else
  run_bench() { cargo bench --quiet --bench table -- "$@"; }
fi
bench_args=(--rate "$RATE" --seconds "$SECONDS_RUN" --work "$WORK")
[ -z "${AGENT_BIN:-}" ] || bench_args+=(--agent "$AGENT_BIN")
sections=()
# "rows[:poll[:cursor[:unfinished[:rate[:max_tracked]]]]]" -> "--rows R --poll P
# --cursor C [--unfinished U] [--rate N] [--max-tracked M]" (after the common
# arguments, so a spec's rate wins)
spec_args() {
  local r p c u n m
  IFS=: read -r r p c u n m <<< "$1"
  echo "--rows $r --poll ${p:-$POLL} --cursor ${c:-updated_at}${u:+ --unfinished $u}${n:+ --rate $n}${m:+ --max-tracked $m}"
}

# Replaces the block between `<!-- $1:begin` and `<!-- $1:end -->` of
# docs/performance.md with the file $2.
write_block() {
  python3 - "$1" "$2" docs/performance.md <<'PY'
import re, sys
name, gen, path = sys.argv[1], open(sys.argv[2]).read().rstrip("\n"), sys.argv[3]
doc = open(path).read()
pat = r"<!-- %s:begin.*?<!-- %s:end -->" % (name, name)
new, n = re.subn(pat, lambda _: gen, doc, flags=re.S)
if n != 1:
    sys.exit("docs/performance.md has no <!-- %s:begin --> … <!-- %s:end --> block" % (name, name))
open(path, "w").write(new)
PY
}

# The span linker's two measurements, ignored tests of tests/tracing.rs
# because they measure: 50,000 completed rows turned into spans exported over
# gRPC (spans per CPU-second of the agent; the test fails below 5,000), and
# the agent's RSS with the collector down and every span dropped, against the
# same agent without [tracing] (fails above +32 MB). The tests start the agent
# their own build made, here the release build; AGENT_BIN does not apply.
run_tracing() {
  echo "== The span linker: spans per CPU-second, memory with the collector down"
  cargo nextest run --release --test it --no-run
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  cargo nextest run --release --test it --run-ignored only --no-capture -E 'test(/^tracing::/)' 2>&1 | tee "$WORK/tracing.log"
  python3 - "$WORK/tracing.log" "$WORK/tracing.md" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
lk = re.search(r"linker: (\d+) spans in ([\d.]+) s wall, ([\d.]+) CPU-s of the agent.*?: (\d+) spans per CPU-second; agent RSS (\d+) kB", log)
mem = re.search(r"RSS after reading (\d+) completed rows: (\d+) kB without \[tracing\], (\d+) kB with the collector down", log)
if not lk or not mem:
    sys.exit("error: a span-linker measurement printed no figure; see the output above")
n, wall, cpu, rate, rss = lk.groups()
base, down = mem.group(2), mem.group(3)
mb = lambda kb: "%.1f MB" % (int(kb) / 1024)
rows = format(int(n), ",")
with open(sys.argv[2], "w") as f:
    f.write("| %s completed rows on PostgreSQL, spans exported over gRPC | result | the test fails when |\n" % rows)
    f.write("|---|---:|---|\n")
    f.write("| spans per CPU-second of the agent (its startup and row reads included) | %s (%s CPU-s in %s s wall) | below 5,000 |\n" % (format(int(rate), ","), cpu, wall))
    f.write("| agent RSS once all were exported | %s | — |\n" % mb(rss))
    f.write("| agent RSS without `[tracing]` | %s | — |\n" % mb(base))
    f.write("| agent RSS with the collector down, all %s spans dropped | %s (%+.1f MB) | more than 32 MB above the one without |\n" % (rows, mb(down), (int(down) - int(base)) / 1024))
PY
  {
    echo "<!-- tracing:begin (generated by scripts/bench.sh --tracing and by the full run; edits here are overwritten) -->"
    echo
    echo "Run on $(date -u '+%Y-%m-%d %H:%M UTC') with \`scripts/bench.sh${MODE:+ $MODE}\` (load average $load when the measurements started);"
    echo "$(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), inboxwatch $(git describe --always --dirty) (release build)."
    echo
    cat "$WORK/tracing.md"
    echo
    echo "<!-- tracing:end -->"
  } > "$WORK/tracing-generated.md"
  write_block tracing "$WORK/tracing-generated.md"
  echo "Wrote the span-linker results into docs/performance.md."
}

if [ $TRACING = 1 ]; then
  run_tracing
  exit 0
fi

if [ $SOAK = 1 ]; then
  # The agent from the dist build (what users run, Cargo.toml); the harness
  # from the test profile, which CI builds anyway.
  [ -n "${AGENT_BIN:-}" ] || cargo build --quiet --profile dist --bin inboxwatch
  TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  start_pg
  echo "== Memory soak, PostgreSQL"
  cargo test --quiet --bench table -- --soak --dialect postgres --host "127.0.0.1:$PG_PORT" \
    --rows 100000 --rate "$RATE" --poll "$POLL" --retentions "${SOAK_RETENTIONS:-30,240}" \
    --backlog "${SOAK_BACKLOG:-100000}" --window "${SOAK_WINDOW:-60}" --agent "${AGENT_BIN:-$TARGET/dist/inboxwatch}" \
    --work "$WORK" --out "$WORK/soak.md"
  {
    echo "<!-- soak:begin (generated by scripts/bench.sh --soak; edits here are overwritten) -->"
    echo
    echo "Run on $(date -u '+%Y-%m-%d %H:%M UTC') with \`scripts/bench.sh --soak\` (RATE=$RATE, POLL=$POLL, SOAK_RETENTIONS=${SOAK_RETENTIONS:-30,240}, SOAK_BACKLOG=${SOAK_BACKLOG:-100000}, SOAK_WINDOW=${SOAK_WINDOW:-60});"
    echo "$(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $("$PGBIN/postgres" --version), inboxwatch $(git describe --always --dirty)${AGENT_BIN:+ (agent: $AGENT_BIN)}."
    echo
    cat "$WORK/soak.md"
    echo "<!-- soak:end -->"
  } > "$WORK/soak-generated.md"
  write_block soak "$WORK/soak-generated.md"
  echo "Wrote the soak results into docs/performance.md."
  exit 0
fi

if [ $CI = 1 ]; then
  # CI checks the harness (exact counters, P95 within 1 %), not timings: the
  # two databases run side by side, each on its own server and in its own work
  # directory, from one build.
  cargo test --quiet --bench table --no-run
  start_pg
  start_mariadb
  ci_runs() { # dialect, host, specs...
    local d=$1 h=$2 spec
    shift 2
    mkdir -p "$WORK/$d"
    for spec in "$@"; do
      echo "== $d, $spec"
      # shellcheck disable=SC2046
      run_bench --dialect "$d" --host "$h" --rate "$RATE" --seconds "$SECONDS_RUN" --work "$WORK/$d" \
        ${AGENT_BIN:+--agent "$AGENT_BIN"} $(spec_args "$spec") --out "$WORK/$d/$spec.md" || return 1
    done
  }
  # shellcheck disable=SC2086
  ci_runs postgres "127.0.0.1:$PG_PORT" $PG_ROWS >"$WORK/ci-postgres.log" 2>&1 &
  pg_runs=$!
  # shellcheck disable=SC2086
  ci_runs mysql "127.0.0.1:$MY_PORT" $MY_ROWS >"$WORK/ci-mysql.log" 2>&1 &
  my_runs=$!
  failed=0
  wait "$pg_runs" || failed=1
  wait "$my_runs" || failed=1
  cat "$WORK/ci-postgres.log" "$WORK/ci-mysql.log"
  if [ $failed = 1 ]; then
    echo "error: the benchmark harness failed (above)" >&2
    exit 1
  fi
  echo "Benchmark harness OK (CI size; results not written)."
  exit 0
fi

# The agent users run: the dist profile (Cargo.toml), which the image builds.
# AGENT_BIN stays unset for it, so the results' header names an agent only
# when one was given.
if [ -z "${AGENT_BIN:-}" ]; then
  cargo build --quiet --profile dist --bin inboxwatch
  bench_args+=(--agent "$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/dist/inboxwatch")
fi

start_pg
for spec in $PG_ROWS; do
  echo "== PostgreSQL, $spec"
  # shellcheck disable=SC2046
  run_bench --dialect postgres --host "127.0.0.1:$PG_PORT" "${bench_args[@]}" $(spec_args "$spec") --out "$WORK/pg-$spec.md"
  sections+=("$WORK/pg-$spec.md")
done
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg" -m fast -w stop >/dev/null 2>&1 || as_owner postgres "$PGBIN/pg_ctl" -D "$WORK/pg" -m fast -w stop >/dev/null
PG_PID=

start_mariadb
for spec in $MY_ROWS; do
  echo "== MariaDB, $spec"
  # shellcheck disable=SC2046
  run_bench --dialect mysql --host "127.0.0.1:$MY_PORT" "${bench_args[@]}" $(spec_args "$spec") --out "$WORK/my-$spec.md"
  sections+=("$WORK/my-$spec.md")
done

if [ $GROWTH = 1 ]; then
  # One line per run from each section's table, then the sections themselves.
  python3 - "$WORK/growth.md" "${sections[@]}" <<'PY'
import re, sys
out, paths = sys.argv[1], sys.argv[2:]
def cell(text, label, col):
    m = re.search(r"^\| " + re.escape(label) + r"[^|]*\|([^|]*)\|([^|]*)\|", text, re.M)
    return m.group(col).strip() if m else "—"
lines = ["| database | unfinished rows | inboxwatch mean (ms) | median | p95 | rows read per poll | agent peak RSS (MB) | exporter mean (ms) | exporter ÷ inboxwatch (mean) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for p in paths:
    t = open(p).read()
    # "### PostgreSQL — 2 M rows (1000 unfinished), …"
    head = re.search(r"^### (\S+) — (.+?) rows \((\d+) unfinished\)", t, re.M)
    db, unf = (head.group(1), format(int(head.group(3)), ",")) if head else ("?", "?")
    mean = cell(t, "database time, mean", 1)
    ratio = re.search(r"^\| database time, mean[^|]*\|[^|]*\|[^|]*\|([^|]*)\|", t, re.M)
    rows = cell(t, "rows read", 1) if "rows read" in t else cell(t, "rows examined", 1)
    lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        db, unf, mean, cell(t, "database time, median", 1), cell(t, "database time, p95", 1),
        rows, cell(t, "peak RSS of the exporter process", 1), cell(t, "database time, mean", 2),
        ratio.group(1).strip() if ratio else "—"))
open(out, "w").write("\n".join(lines) + "\n")
PY
  {
    echo "<!-- growth:begin (generated by scripts/bench.sh --growth; edits here are overwritten) -->"
    echo
    echo "Run on $(date -u '+%Y-%m-%d %H:%M UTC') with \`scripts/bench.sh --growth\` (RATE=$RATE, POLL=$POLL, SECONDS_RUN=$SECONDS_RUN, PG_ROWS=\"$PG_ROWS\", MY_ROWS=\"$MY_ROWS\");"
    echo "$(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $("$PGBIN/postgres" --version), $(mariadbd --version | awk '{print $3}'), inboxwatch $(git describe --always --dirty)${AGENT_BIN:+ (agent: $AGENT_BIN)}."
    echo
    cat "$WORK/growth.md"
    echo
    echo "<details><summary>Each run in full</summary>"
    echo
    for s in "${sections[@]}"; do sed 's/^### /#### /' "$s"; echo; done
    echo "</details>"
    echo
    echo "<!-- growth:end -->"
  } > "$WORK/growth-generated.md"
  write_block growth "$WORK/growth-generated.md"
  echo "Wrote the growth table into docs/performance.md."
  exit 0
fi

# Replace the generated part of docs/performance.md.
{
  echo "<!-- $BLOCK:begin (generated by scripts/bench.sh; edits here are overwritten) -->"
  echo
  echo "Run on $(date -u '+%Y-%m-%d %H:%M UTC') with \`scripts/bench.sh\` (RATE=$RATE, POLL=$POLL, SECONDS_RUN=$SECONDS_RUN, PG_ROWS=\"$PG_ROWS\", MY_ROWS=\"$MY_ROWS\"${BLOCK_SET:+, BLOCK=$BLOCK})."
  echo "Machine: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/^Mem:/ {print $2}') GB RAM,"
  echo "$(. /etc/os-release && echo "$PRETTY_NAME"), $("$PGBIN/postgres" --version), $(mariadbd --version | awk '{print $3}'),"
  echo "prometheus-sql-exporter $(dpkg-query -W -f='${Version}' prometheus-sql-exporter 2>/dev/null || echo unknown); inboxwatch $(git describe --always --dirty)${AGENT_BIN:+ (agent: $AGENT_BIN)}."
  echo
  for s in "${sections[@]}"; do cat "$s"; echo; done
  echo "<!-- $BLOCK:end -->"
} > "$WORK/generated.md"
write_block "$BLOCK" "$WORK/generated.md"
echo "Wrote the results into docs/performance.md."
# A run into another block measures what it was asked to, not the span linker.
[ -n "$BLOCK_SET" ] || run_tracing
