"""Measures the shape of the house: what the issue of the floors counts, before and after.

    .venv/bin/python scripts/house_report.py [SRC_DIR]

SRC_DIR (default ``src/fairlane``) is the package to measure; it must be the one that
``import fairlane`` finds (run from a checkout, or set PYTHONPATH to its ``src``). Prints:

* import cycles: groups of modules that import each other, directly or not (grimp's
  graph: imports under TYPE_CHECKING and inside functions count);
* upward imports: module pairs whose import runs against the floors, a module's floor
  read from its first name below ``fairlane`` (the table below; ``sim`` may import only
  the policy core and the declarations);
* the ten largest files and classes, and how many pass 500 and 300 lines;
* lines in top-level modules;
* raw Redis calls outside ``store/``: calls of a Redis command's name on an object
  named like a client or a pipeline (a heuristic: read the listed places).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

# the floors, bottom first; a name not listed has no floor (and is reported)
FLOORS: dict[str, int] = {
    **dict.fromkeys(("policy", "errors"), 0),
    **dict.fromkeys(("codec", "config", "lanes", "pools"), 1),
    **dict.fromkeys(("store", "explain", "runview"), 2),
    "payloads": 3,
    "registry": 4,
    **dict.fromkeys(("runtime", "usage"), 5),
    **dict.fromkeys(("metrics", "tracing", "insight", "devserver"), 6),
    **dict.fromkeys(("app", "task", "workflows", "tenants", "admission"), 7),
    "sim": 8,
    **dict.fromkeys(("demo", "gateway", "example", "testing", "charts"), 9),
    **dict.fromkeys(("cli", "bench"), 10),
}
SIM_MAY_IMPORT = frozenset({0, 1, 8})
REDIS_COMMANDS = frozenset(
    [
        "hget",
        "hgetall",
        "hmget",
        "hset",
        "hdel",
        "hincrby",
        "hlen",
        "hexists",
        "hkeys",
        "hvals",
        "hscan",
        "mget",
        "exists",
        "zrange",
        "zrangebyscore",
        "zrevrange",
        "zrevrangebyscore",
        "zcard",
        "zscore",
        "zadd",
        "zrem",
        "zcount",
        "zremrangebyscore",
        "smembers",
        "scard",
        "sadd",
        "srem",
        "sismember",
        "lrange",
        "llen",
        "lpush",
        "rpush",
        "scan",
        "scan_iter",
        "expire",
        "pexpire",
        "ttl",
        "pttl",
        "xrange",
        "xadd",
        "xlen",
        "fcall",
        "fcall_ro",
        "eval",
        "evalsha",
        "publish",
        "pipeline",
        "pubsub",
        "script_load",
        "function_load",
        "function_list",
        "dbsize",
        "unlink",
        "incr",
        "incrby",
        "config_get",
        "memory_usage",
    ]
)
CLIENT_NAMES = ("client", "redis", "pipe", "pipeline", "conn", "primary", "node")


def floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of two or more modules that import each other, directly or not (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for module, imported in sorted(edges.items()):
        here = floor(module)
        if here is None:
            continue
        for other in sorted(imported):
            there = floor(other)
            if there is None:
                continue
            if (here == FLOORS["sim"] and there not in SIM_MAY_IMPORT) or (
                here != FLOORS["sim"] and there > here
            ):
                found.append((module, other))
    return found


def raw_redis_calls(root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in REDIS_COMMANDS:
                continue
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name.lower().endswith(CLIENT_NAMES):
                key = str(path.relative_to(root))
                counts[key] = counts.get(key, 0) + 1
    return counts


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    files, classes = [], []
    for path in root.rglob("*.py"):
        text = path.read_text()
        rel = str(path.relative_to(root))
        files.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
    return sorted(files, reverse=True), sorted(classes, reverse=True)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/fairlane").resolve()
    graph = grimp.build_graph("fairlane", include_external_packages=False, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = strongly_connected(edges)
    print(f"import cycles: {len(cycles)}")
    for group in cycles:
        print(f"  {len(group)} modules: {', '.join(group)}")
    ups = upward(edges)
    print(f"upward imports: {len(ups)}")
    for module, other in ups:
        print(f"  {module} -> {other}")
    unplaced = sorted(m for m in graph.modules if m != "fairlane" and floor(m) is None)
    if unplaced:
        print(f"modules on no floor: {', '.join(unplaced)}")
    files, classes = sizes(root)
    print(f"files over 500 lines: {sum(n > 500 for n, _ in files)}; ten largest:")
    for n, name in files[:10]:
        print(f"  {n:5} {name}")
    print(f"classes over 300 lines: {sum(n > 300 for n, _ in classes)}; ten largest:")
    for n, name in classes[:10]:
        print(f"  {n:5} {name}")
    total = sum(n for n, _ in files)
    top = [(n, name) for n, name in files if "/" not in name]
    share = sum(n for n, _ in top)
    print(f"top-level modules: {len(top)}, {share} of {total} lines ({100 * share / total:.1f} %)")
    raw = raw_redis_calls(root)
    print(f"raw Redis calls outside store/: {sum(raw.values())}")
    for name, n in sorted(raw.items(), key=lambda kv: -kv[1]):
        print(f"  {n:3} {name}")


if __name__ == "__main__":
    main()
