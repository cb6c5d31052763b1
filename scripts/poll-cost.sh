#!/usr/bin/env bash
# Measures what one poll of an inbox source costs on PostgreSQL:
# builds a table of ROWS rows (1 % unfinished) with the recommended indexes,
# runs the release agent against it (poll 1 s, overlap 30 s) while a writer
# makes about RATE changes/s for SECONDS seconds, then prints the agent's mean
# poll time and rows read per poll, and EXPLAIN ANALYZE of the tail and gauge
# queries on the same table.
#
#   scripts/poll-cost.sh [ROWS] [SECONDS] [RATE]     (defaults: 1000000 60 400)
#
# Uses the PostgreSQL at $PGURL (default postgres://postgres@127.0.0.1:5432/test)
# and a table named poll_cost_inbox, dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-1000000}
SECONDS_RUN=${2:-60}
RATE=${3:-400}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/test}
PORT=${PORT:-19479}
T=poll_cost_inbox
psql_() { psql -q -X -v ON_ERROR_STOP=1 "$PGURL" "$@"; }

cargo build --release --quiet
psql_ -c "DROP TABLE IF EXISTS $T"
./target/release/inboxwatch schema --dialect postgres --table "$T" | psql_
psql_ <<SQL
INSERT INTO $T (event_id, event_type, status, received_at, started_at, finished_at, attempts, deliveries, updated_at)
SELECT 'e' || g,
       (ARRAY['orders.created','payments.captured','shipments.dispatched','invoices.issued'])[1 + g % 4],
       CASE WHEN g % 100 = 0 THEN (ARRAY['pending','processing','failed'])[1 + (g / 100) % 3]
            WHEN g % 97 = 0 THEN 'dead' ELSE 'succeeded' END,
       now() - ($ROWS - g) * interval '2 seconds',
       now() - ($ROWS - g) * interval '2 seconds' + interval '50 ms',
       CASE WHEN g % 100 = 0 THEN NULL ELSE now() - ($ROWS - g) * interval '2 seconds' + interval '150 ms' END,
       1 + (g % 7 = 0)::int, 1 + (g % 33 = 0)::int,
       now() - ($ROWS - g) * interval '2 seconds' + interval '150 ms'
FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE $T;
SQL

cfg=$(mktemp)
cat > "$cfg" <<TOML
[server]
listen = "127.0.0.1:$PORT"
[[sources]]
name = "cost"
kind = "inbox"
dsn = "$PGURL"
table = "$T"
poll_interval = "1s"
overlap = "30s"
TOML
./target/release/inboxwatch run --config "$cfg" 2>/dev/null &
agent=$!
trap 'kill $agent 2>/dev/null; rm -f "$cfg"; psql_ -c "DROP TABLE IF EXISTS $T" >/dev/null' EXIT
sleep 3

# Each tick inserts BATCH new events and completes the previous tick's: 2*BATCH changes.
BATCH=$(( RATE / 8 ))
end=$(( SECONDS + SECONDS_RUN )); n=0
while [ $SECONDS -lt $end ]; do
  n=$((n + 1))
  psql_ -c "INSERT INTO $T (event_id,event_type,status,received_at,updated_at) SELECT 'w$n-' || g, 'orders.created', 'pending', now(), now() FROM generate_series(1,$BATCH) g;
            UPDATE $T SET status='succeeded', started_at=now()-interval '100 ms', finished_at=now(), attempts=1, updated_at=now() WHERE event_id IN (SELECT 'w' || ($n-1) || '-' || g FROM generate_series(1,$BATCH) g);"
  sleep 0.25
done
sleep 2
metrics=$(curl -s "http://127.0.0.1:$PORT/metrics")
val() { echo "$metrics" | awk -v k="$1" 'index($0, k) == 1 { print $2 }'; }
sum=$(val 'inboxwatch_poll_duration_seconds_sum{source="cost"}')
count=$(val 'inboxwatch_poll_duration_seconds_count{source="cost"}')
rows=$(val 'inboxwatch_rows_read_total{source="cost"}')
received=$(val 'inbox_messages_received_total{source="cost",event_type="orders.created"}')
echo "table rows:            $ROWS (1 % unfinished)"
echo "writer:                $n ticks, $((n * BATCH)) events received by the generator, $received counted by the agent"
echo "polls:                 $count"
awk -v s="$sum" -v c="$count" -v r="$rows" 'BEGIN { printf "mean poll (agent):     %.2f ms\nrows read per poll:    %.0f\n", 1000*s/c, r/c }'
echo "EXPLAIN ANALYZE (database time of one poll's queries):"
psql_ -At <<SQL | grep -E 'Execution Time|Scan'
EXPLAIN ANALYZE SELECT CAST("event_id" AS TEXT), CAST("event_type" AS TEXT), CAST("status" AS TEXT), CAST(EXTRACT(EPOCH FROM "received_at") * 1000000 AS BIGINT), CAST(EXTRACT(EPOCH FROM "started_at") * 1000000 AS BIGINT), CAST(EXTRACT(EPOCH FROM "finished_at") * 1000000 AS BIGINT), CAST("attempts" AS BIGINT), CAST("deliveries" AS BIGINT), CAST(CHAR_LENGTH("last_error") AS BIGINT), CAST(EXTRACT(EPOCH FROM "updated_at") * 1000000 AS BIGINT) FROM "$T" WHERE "updated_at" > now() - interval '3 seconds' ORDER BY "updated_at" LIMIT 5000;
EXPLAIN ANALYZE SELECT CAST("status" AS TEXT), CAST("event_type" AS TEXT), COUNT(*), CAST(EXTRACT(EPOCH FROM MIN("received_at")) * 1000000 AS BIGINT), CAST(SUM(CASE WHEN "status" IN ('processing') AND CAST(EXTRACT(EPOCH FROM "started_at") * 1000000 AS BIGINT) < 0 THEN 1 ELSE 0 END) AS BIGINT) FROM "$T" WHERE "status" IN ('failed', 'pending', 'processing') GROUP BY "status", "event_type";
SQL
