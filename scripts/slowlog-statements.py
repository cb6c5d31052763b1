#!/usr/bin/env python3
"""The agent's statements in a MariaDB slow query log, by time.

    scripts/slowlog-statements.py SLOW_LOG [USER]

For a log kept by `MY_SLOW_LOG=path scripts/bench.sh` (every statement,
long_query_time = 0). MariaDB's performance_schema counts no executions of
prepared statements, which are all the agent runs, so this is where its
time per statement shows. Statements are grouped by their text with the
select list, literals and numbers taken out; USER defaults to the bench's
agent user, iw_agent.
"""
import collections
import re
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    user = sys.argv[2] if len(sys.argv) > 2 else "iw_agent"
    text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
    by = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for entry in re.split(r"\n(?=# User@Host)", text):
        if not entry.startswith(f"# User@Host: {user}["):
            continue
        m = re.search(r"Query_time: ([\d.]+).*?Rows_sent: (\d+)\s+Rows_examined: (\d+)", entry, re.S)
        if not m:
            continue
        lines = [
            line for line in entry.split("\n")
            if not line.startswith(("#", "SET timestamp", "use "))
        ]
        q = " ".join(lines)
        q = re.sub(r"CASE WHEN .*? END", "CASE", q)
        q = re.sub(r"^SELECT CAST\(`event_id`.*? FROM", "SELECT <row> FROM", q)
        q = re.sub(r"'[^']*'", "?", q)
        q = re.sub(r"\b\d+\b", "N", q)
        q = re.sub(r"\(\?(, \?)*\)", "(?…)", q)
        q = re.sub(r"\s+", " ", q).strip()
        s = by[q[:200]]
        s[0] += 1
        s[1] += float(m.group(1)) * 1000
        s[2] += int(m.group(2))
        s[3] += int(m.group(3))
    total = sum(s[1] for s in by.values())
    print(f"{'calls':>7} {'total ms':>9} {'mean ms':>8} {'rows sent':>10} {'examined':>9}  statement")
    for q, (calls, ms, sent, examined) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{calls:>7} {ms:>9.1f} {ms / calls:>8.3f} {sent:>10} {examined:>9}  {q}")
    print(f"{'':>7} {total:>9.1f}  in all")


if __name__ == "__main__":
    main()
