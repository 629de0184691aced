"""The emulator's request counts (`GET /sim/api-stats`, sim/apiserver/api_stats.py) as rich tables:
`karpflow sim api-stats` and bench/bench_api_load.py print them."""

from __future__ import annotations

from collections import defaultdict

from rich.table import Table

from sim.apiserver.api_stats import StatsDoc, StatsRow


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def users_table(doc: StatsDoc) -> Table:
    """One row per user: what each client asked of the server since the counts began."""
    seconds = max(doc.seconds, 1e-9)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for row in doc.rows:
        entry = totals[row.user]
        entry[0] += row.requests
        entry[1] += row.response_bytes
        entry[2] += row.full_lists
        entry[3] += row.rejected
    table = Table(title=f"API requests by user, over {doc.seconds:.0f} s")
    for column in ("user", "requests", "req/s", "bytes", "bytes/s", "full LISTs", "429s"):
        table.add_column(column, justify="left" if column == "user" else "right")
    for user, (requests, sent, full, rejected) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        table.add_row(
            user,
            str(requests),
            f"{requests / seconds:.2f}",
            human_bytes(sent),
            human_bytes(sent / seconds),
            str(full),
            str(rejected),
        )
    return table


def verbs_table(doc: StatsDoc, user: str, seconds: float | None = None, title: str | None = None) -> Table:
    """One user's requests by verb and resource, busiest first; rates over `seconds` (default: the
    whole count)."""
    over = max(seconds if seconds is not None else doc.seconds, 1e-9)
    rows: list[StatsRow] = sorted((r for r in doc.rows if r.user == user), key=lambda r: -r.requests)
    table = Table(title=title or f"{user}: by verb and resource, over {over:.0f} s")
    for column in ("verb", "resource", "requests", "req/s", "bytes/s", "full LISTs", "429s"):
        table.add_column(column, justify="left" if column in ("verb", "resource") else "right")
    for row in rows:
        table.add_row(
            row.verb,
            row.resource,
            str(row.requests),
            f"{row.requests / over:.2f}",
            human_bytes(row.response_bytes / over),
            str(row.full_lists),
            str(row.rejected),
        )
    return table


def difference(after: StatsDoc, before: StatsDoc) -> StatsDoc:
    """The counts between two readings (rows that did not move are left out)."""
    earlier = {(r.user, r.verb, r.resource): r for r in before.rows}
    rows = []
    for row in after.rows:
        old = earlier.get((row.user, row.verb, row.resource))
        moved = StatsRow(
            user=row.user,
            verb=row.verb,
            resource=row.resource,
            requests=row.requests - (old.requests if old else 0),
            response_bytes=row.response_bytes - (old.response_bytes if old else 0),
            full_lists=row.full_lists - (old.full_lists if old else 0),
            rejected=row.rejected - (old.rejected if old else 0),
        )
        if moved.requests or moved.response_bytes:
            rows.append(moved)
    return StatsDoc(since=before.since + before.seconds, seconds=after.seconds - before.seconds, rows=rows)
