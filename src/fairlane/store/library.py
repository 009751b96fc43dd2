"""The Lua library as the server loads it: its source assembled, named and parameterised.

``lua/fairlane.lua`` is the library: its header (the keys every function receives), its
modules and its registered entry points. It pulls in the other files of ``lua/`` where
it says ``-- @include <file>``, in dependency order: ``core`` (the fixed keys, clock,
prefix and hot-path helpers), ``classes`` (the class rules), ``rates`` (rate keys'
buckets, pauses, adaptive limits), ``throttle`` (throttle keys, tenant ceilings),
``fairqueue`` (tenants within a class), ``fairkeys`` (a tenant's fairness keys),
``bounds`` (queue bounds), ``admission`` (reservations and deferral), ``runs`` and
``records`` (workflow runs' keys, settling records), ``workflows`` (durable runs),
``acks`` (settling a batch of outcomes), ``lease`` (handing jobs out), ``dispatch``
(which jobs a worker gets), ``handoff`` (an enqueue's lone job leased straight to an idle
worker), ``enqueue`` (storing submitted jobs), ``worker`` (a worker's
calls), ``control`` (queries and declarations) and ``tenantsweep``. Each file is one
module: one table, its only top-level local, whose helpers live in the module's own
block; its header names the keys it touches, the modules it calls and its entry points
(``tests/architecture/test_lua_modules.py`` holds the library to that). Which policy
module, simulator fast path and agreement test stand beside each file is
``docs/contracts/twins.md``.

Constants the policy core owns (the default service classes, the ceilings' signal
windows and pressure bounds, the least charge, fair deferral's overtake limit and pass
budget, how often a single enqueue reads its lane's bound, an adaptive key's cut, the
pushbacks a job may take and the ring of a class's starts) and the fence key's name from
``fairlane.store.keys`` (the scripts cut the app's prefix from it) are written into
the source here, so the scripts, the policy and the key layout never disagree on them.
The library is named after its content so that workers of two releases sharing a
server during a rolling deploy each call the code they were written against.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from importlib.resources import files
from typing import Final

from fairlane.policy import (
    admission,
    ceilings,
    deadlineorder,
    globalkeys,
    pauses,
    ratekeys,
    rates,
    startpredict,
    starts,
)
from fairlane.policy.admission import (
    EstimationSettings,
    PoolConfig,
    bounds,
    deferral,
    to_milli,
    unit_table,
)
from fairlane.policy.backoff import Backoff
from fairlane.policy.classes import DEFAULT_CLASSES, ClassTable, ServiceClass
from fairlane.policy.retention import Retention
from fairlane.store.keys import COST_KEY_SEP, RECORD_DEFAULTS, SHARDED_PREFIX_PATTERN, AppKeys
from fairlane.store.placed import as_lists
from fairlane.store.wire import AdmissionField, ClassField, lua_names

__all__ = [
    "FUNCTION_PREFIX",
    "LIBRARY_CODE",
    "LIBRARY_NAME",
    "encode_admission",
    "encode_classes",
    "fill_constants",
    "instrumented_code",
]

_LUA = files("fairlane.store").joinpath("lua")
_INCLUDE = re.compile(r"^-- @include ([\w.]+)$", re.MULTILINE)
# what crosses the seam, by name (store/wire.py): written in as literals, so a name costs
# the server nothing and a misspelt one fails here, when the library is assembled
_WIRE_NAMES: Final = lua_names()
_WIRE_PREFIXES: Final = frozenset(name.split(".")[0] for name in _WIRE_NAMES)
# a dot and an UPPER name, the prefix read back from the dot and the word boundaries
# checked in Python: the rarer part first, as ``Capitalised.UPPER`` made the engine try
# every capital letter of the library (ten times as long over it, on every import), a
# pattern of the prefixes' alternation 4.5 times as long again
_WIRE_TAIL = re.compile(r"\.[A-Z_]+")
# the policy's constants (``fill_constants``), all found in one pass
_CONSTANT = re.compile(r"__[A-Z][A-Z_]*__")


def _wire_names(source: str) -> str:
    """``source`` with every ``Prefix.NAME`` of the wire written in as its literal."""
    out: list[str] = []
    done = 0
    for tail in _WIRE_TAIL.finditer(source):
        dot, end = tail.span()
        start = dot
        while start > 0 and source[start - 1].isalpha():
            start -= 1
        prefix = source[start:dot]
        if not prefix[:1].isupper() or prefix not in _WIRE_PREFIXES:
            continue
        if (start > 0 and _word(source[start - 1])) or (end < len(source) and _word(source[end])):
            continue  # inside a longer word
        out.append(source[done:start])
        out.append(_WIRE_NAMES[source[start:end]])
        done = end
    out.append(source[done:])
    return "".join(out)


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def encode_classes(classes: Iterable[ServiceClass]) -> str:
    """A class table as the scripts read it: JSON ``[[name, share, min, lendable,
    borrowable (-1 = up to C), batch (0/1), max_wait ms (-1 = never ages), restricted
    (0/1), deadline_order (0/1)], ..]`` in declared order (``max_wait``, ``restricted``
    and ``deadline_order`` trail, so a table stored without them still reads:
    unrestricted, FIFO)."""
    rows = []
    for c in classes:
        row = {
            ClassField.NAME: c.name,
            ClassField.SHARE: c.nominal_share,
            ClassField.MIN_SLOTS: c.min_slots,
            ClassField.LENDABLE: c.lendable,
            ClassField.BORROWABLE: -1 if c.borrowable is None else c.borrowable,
            ClassField.BATCH: int(c.batch),
            ClassField.MAX_WAIT: -1 if c.max_wait_ms is None else c.max_wait_ms,
            ClassField.RESTRICTED: int(c.restricted),
            ClassField.DEADLINE_ORDER: int(c.deadline_order),
        }
        rows.append([row[f] for f in ClassField])
    return json.dumps(rows, separators=(",", ":"))


def encode_admission(
    table: ClassTable, pool: PoolConfig, estimation: EstimationSettings, shards: int = 1
) -> tuple[str, str]:
    """A lane's admission config and its class table in milli-units, as the scripts
    read them (``lua/admission.lua``): JSON ``{C, R, max, safety, window, classes: {name:
    [max_queue, max_queue_mu (-1 none), tenant_max_queue, max_deferred, defer,
    tenant_max_queue_mu (-1 none)]}}``, and ``n``, the app's shard count, when it has
    more than one: its pool is then global, shared by the shards in parts."""
    classes = {}
    for c in table:
        adm = pool.admission(c.name)
        queue_mu = adm.max_queue_milli
        bounds = {
            AdmissionField.MAX_QUEUE: adm.max_queue,
            AdmissionField.MAX_QUEUE_MU: -1 if queue_mu is None else queue_mu,
            AdmissionField.TENANT_MAX_QUEUE: adm.tenant_limit,
            AdmissionField.MAX_DEFERRED: adm.deferred_limit,
            AdmissionField.DEFER: int(adm.when_full == "defer"),
            AdmissionField.TENANT_MAX_QUEUE_MU: (
                -1 if adm.tenant_queue_milli is None else adm.tenant_queue_milli
            ),
        }
        classes[c.name] = [bounds[f] for f in AdmissionField]
    config = {
        "C": pool.capacity_milli,
        "R": pool.reserve_milli,
        "max": to_milli(estimation.max_reservation_units),
        "safety": estimation.safety_multiplier,
        "window": estimation.update_window,
        "classes": classes,
    }
    if shards > 1:
        config["n"] = shards
    return json.dumps(config, separators=(",", ":")), encode_classes(unit_table(table, pool))


#: a task's retention as its declaration stores it ('rc|rf'), for a job whose task has none
_DEFAULT_RETENTION: Final = f"{Retention().completed.encode()}|{Retention().failed.encode()}"


def fill_constants(source: str) -> str:
    """``source`` with the policy's constants written in where the Lua names them."""
    constants = {
        "__DEFAULT_CLASSES__": encode_classes(DEFAULT_CLASSES),
        "__RATE_BUCKETS__": str(ceilings.RATE_BUCKETS),
        "__RATE_WIDTH_MS__": str(ceilings.RATE_WIDTH_MS),
        "__F_MIN__": repr(ceilings.F_MIN),
        "__F_MAX__": repr(ceilings.F_MAX),
        "__DURATION_ALPHA__": repr(ceilings.DURATION_ALPHA),
        "__MIN_CHARGE_MILLI__": str(admission.MIN_CHARGE_MILLI),
        "__OVERTAKE_LIMIT__": str(deferral.OVERTAKE_LIMIT),
        "__PASS_BUDGET__": str(deferral.PASS_BUDGET),
        "__LANE_READ_EVERY__": str(bounds.LANE_READ_EVERY),
        "__ADAPTIVE_CUT__": repr(rates.ADAPTIVE_CUT),
        "__UNLIMITED__": str(ratekeys.UNLIMITED),
        "__DUE_BATCH__": str(ratekeys.DUE_BATCH),
        "__PARK_BUDGET__": str(ratekeys.PARK_BUDGET),
        "__LIFT_BUDGET__": str(pauses.LIFT_BUDGET),
        "__USAGE_WINDOW_MS__": str(startpredict.USAGE_WINDOW_MS),
        "__DEADLINE_SAFETY__": repr(startpredict.DEADLINE_SAFETY),
        "__DEFAULT_BACKOFF__": Backoff().encode(),
        "__DEFAULT_RETENTION__": _DEFAULT_RETENTION,
        "__COST_KEY_SEP__": COST_KEY_SEP,
        "__DEFAULT_TENANT__": RECORD_DEFAULTS["tenant"],
        "__DEFAULT_LANE__": RECORD_DEFAULTS["lane"],
        "__DEFAULT_MAX__": RECORD_DEFAULTS["max"],
        "__DEFAULT_TO__": RECORD_DEFAULTS["to"],
        "__DEFAULT_CLASS__": RECORD_DEFAULTS["cls"],
        "__DEFAULT_RC__": Retention().completed.encode(),
        "__DEFAULT_RF__": Retention().failed.encode(),
        "__MAX_PUSHBACKS__": str(rates.MAX_PUSHBACKS),
        "__PART_EPSILON__": repr(globalkeys.EPSILON),
        "__DEADLINE_EPOCH_MS__": str(deadlineorder.DEADLINE_EPOCH_MS),
        "__DEADLINE_TICK_MS__": str(deadlineorder.DEADLINE_TICK_MS),
        "__DEADLINE_SPAN__": str(deadlineorder.DEADLINE_SPAN),
        "__STARTS_WIDTH_MS__": str(starts.WIDTH_MS),
        "__STARTS_BUCKETS__": str(starts.BUCKETS),
        "__RETRY_START__": str(starts.RETRY_START),
        # an app of no prefix: what is left of its fence key is the key's own name
        "__FENCE_NAME__": AppKeys("").fence,
        "__SHARDED_PREFIX__": SHARDED_PREFIX_PATTERN,
    }
    source = _CONSTANT.sub(lambda found: constants.get(found.group(0), found.group(0)), source)
    return as_lists(_wire_names(source))


def _assemble(module: Callable[[str, str], str] | None = None) -> str:
    main = _LUA.joinpath("fairlane.lua").read_text()

    def include(m: re.Match[str]) -> str:
        text = _LUA.joinpath(m.group(1)).read_text()
        return text if module is None else module(m.group(1), text)

    return fill_constants(_INCLUDE.sub(include, main))


def _named(source: str) -> str:
    return source.replace("__LIBRARY__", LIBRARY_NAME).replace("__PREFIX__", FUNCTION_PREFIX)


_SOURCE: Final = _assemble()
_VERSION: Final = hashlib.sha256(_SOURCE.encode()).hexdigest()[:10]
FUNCTION_PREFIX: Final = f"fl{_VERSION}_"
LIBRARY_NAME: Final = f"fairlane_{_VERSION}"
LIBRARY_CODE: Final = _named(_SOURCE)


def instrumented_code(module: Callable[[str, str], str]) -> str:
    """The library under this release's name with each module's text as ``module(file,
    text)`` rewrites it: a server that holds it runs it in place of ``LIBRARY_CODE`` (the
    store loads a library only when none of its name is there). For measuring the
    library from inside (``benchmarks/luaprofile.py``), never for serving."""
    return _named(_assemble(module))
