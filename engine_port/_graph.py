"""The one graph format: ``Workflow`` definitions, stages and their canonical JSON model."""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import math
import re
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from ._limits import (
    check_hook_name,
    check_signal_name,
    check_stage_id,
    check_version,
    check_workflow_id,
    definition_error,
)
from ._models import StageStatus
from .errors import (
    DefinitionError,
    EngineError,
    InvalidInputError,
    InvalidRedriveError,
    NonRetryableError,
    UnknownRedriveStageError,
)

if TYPE_CHECKING:
    from ._context import StageContext

__all__ = ["GraphModel", "Retry", "RetryModel", "Stage", "StageSpec", "Workflow", "check_handler"]

InT = TypeVar("InT", bound=BaseModel)
_MAX_DELAY_S = 365 * 24 * 3600.0
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")
_WF_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")


def _qualname(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def _check_attempts_and_backoff(max_attempts: object, backoff: object) -> None:
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise DefinitionError(
            f"Retry.max_attempts must be an int, not {type(max_attempts).__name__}"
        )
    if max_attempts < 1:
        raise DefinitionError("Retry.max_attempts must be at least 1")
    if isinstance(backoff, bool) or not isinstance(backoff, int | float):
        raise DefinitionError(f"Retry.backoff must be a number, not {type(backoff).__name__}")
    if not math.isfinite(backoff) or backoff < 1.0:
        raise DefinitionError("Retry.backoff must be a finite number >= 1.0")


def _check_intervals(initial_interval: object, max_interval: object) -> None:
    if not isinstance(initial_interval, timedelta):
        raise DefinitionError(
            "Retry.initial_interval must be a timedelta (e.g. timedelta(seconds=1))"
        )
    if initial_interval < timedelta(0):
        raise DefinitionError("Retry.initial_interval must not be negative")
    if max_interval is not None:
        if not isinstance(max_interval, timedelta):
            raise DefinitionError("Retry.max_interval must be a timedelta or None")
        if max_interval < timedelta(0):
            raise DefinitionError("Retry.max_interval must not be negative")


def _exception_classes(non_retryable: object) -> tuple[type[BaseException], ...]:
    """``Retry.non_retryable`` as a tuple (one class alone is accepted too)."""
    if isinstance(non_retryable, type):
        non_retryable = (non_retryable,)
    if not isinstance(non_retryable, Iterable) or isinstance(non_retryable, str):
        raise DefinitionError("Retry.non_retryable must be a tuple of exception classes")
    classes = tuple(non_retryable)
    for t in classes:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise DefinitionError(f"Retry.non_retryable must hold exception classes, not {t!r}")
    return classes


@dataclass(frozen=True)
class Retry:
    """Per-stage retry policy (attempt 1 is the first try)."""

    max_attempts: int = 3
    initial_interval: timedelta = timedelta(seconds=1)
    backoff: float = 2.0
    max_interval: timedelta | None = None
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        _check_attempts_and_backoff(self.max_attempts, self.backoff)
        _check_intervals(self.initial_interval, self.max_interval)
        object.__setattr__(self, "non_retryable", _exception_classes(self.non_retryable))

    def delay_after(self, attempt: int) -> timedelta:
        """The wait before attempt ``attempt + 1``."""
        return timedelta(seconds=self.model().delay_s(attempt))

    def is_retryable(self, error: BaseException) -> bool:
        if isinstance(error, NonRetryableError):
            return False
        return not (self.non_retryable and isinstance(error, self.non_retryable))

    def model(self) -> RetryModel:
        return RetryModel(
            max_attempts=self.max_attempts,
            initial_interval_s=self.initial_interval.total_seconds(),
            backoff=self.backoff,
            max_interval_s=None if self.max_interval is None else self.max_interval.total_seconds(),
            non_retryable=sorted(_qualname(t) for t in self.non_retryable),
        )


class RetryModel(BaseModel):
    model_config = ConfigDict(frozen=True)
    max_attempts: int
    initial_interval_s: float
    backoff: float
    max_interval_s: float | None = None
    non_retryable: list[str] = []

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` before the next one (the one
        rule both drivers apply: initial_interval * backoff**(attempt-1), capped)."""
        try:
            seconds = self.initial_interval_s * self.backoff ** max(0, attempt - 1)
        except OverflowError:
            seconds = math.inf
        if self.max_interval_s is not None:
            seconds = min(seconds, self.max_interval_s)
        # a timedelta cannot hold more than ~2.7 million years; cap far below that
        return min(seconds, _MAX_DELAY_S)


class StageSpec(BaseModel):
    """One stage as the drivers see it."""

    model_config = ConfigDict(frozen=True)
    id: str
    after: list[str]
    retry: RetryModel
    timeout_s: float | None = None
    compensable: bool = False
    local: bool = False
    output_schema: dict[str, Any]
    signals: list[str] = []  # the signal names the stage waits for, when declared
    # the signal the stage starts on (``@wf.stage(after_signal=...)``), one of ``signals``,
    # and how long it waits for it (``after_signal_timeout=``)
    after_signal: str | None = None
    after_signal_timeout_s: float | None = None

    @model_serializer(mode="wrap")
    def _drop_undeclared(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        # a stage that declares no signals serialises as before: its workflow keeps its
        # structural version (and stored definitions their JSON)
        data: dict[str, Any] = handler(self)
        if not self.signals:
            data.pop("signals", None)
        if self.after_signal is None:
            data.pop("after_signal", None)
        if self.after_signal_timeout_s is None:
            data.pop("after_signal_timeout_s", None)
        return data


class GraphModel(BaseModel):
    """The canonical, serialisable form of a workflow definition (what both drivers execute)."""

    model_config = ConfigDict(frozen=True)
    workflow_id: str
    version: str
    input_schema: dict[str, Any]
    stages: list[StageSpec]
    groups: list[list[str]]
    hooks: list[str] = []
    timeout_s: float | None = None

    def canonical_json(self) -> str:
        return self.model_dump_json()

    def stage(self, stage_id: str) -> StageSpec:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise DefinitionError(f"workflow {self.workflow_id!r} has no stage {stage_id!r}")

    def sinks(self) -> list[str]:
        used = {d for s in self.stages for d in s.after}
        return [s.id for s in self.stages if s.id not in used]

    def downstream(self, stage_id: str) -> set[str]:
        """``stage_id`` and every stage that depends on it, directly or transitively."""
        self.stage(stage_id)
        out = {stage_id}
        changed = True
        while changed:
            changed = False
            for s in self.stages:
                if s.id not in out and any(d in out for d in s.after):
                    out.add(s.id)
                    changed = True
        return out

    def redrive_set(self, from_: str, statuses: Mapping[str, str], run_id: str) -> set[str]:
        """The stages a redrive from ``from_`` re-runs, given each stage's status: ``start``
        all; ``last_failure`` every stage that did not complete (completed or compensated
        stages keep their outputs); a stage id that stage and everything downstream."""
        if from_ == "start":
            return {s.id for s in self.stages}
        if from_ == "last_failure":
            rerun = {
                s.id
                for s in self.stages
                if statuses.get(s.id) not in (StageStatus.COMPLETED, StageStatus.COMPENSATED)
            }
            if not rerun:
                raise InvalidRedriveError(
                    f"cannot redrive run {run_id!r} from its last failure: it has no failed "
                    "stage; redrive it from 'start' or from one of its stages "
                    f"{sorted(s.id for s in self.stages)}"
                )
            return rerun
        if from_ in {s.id for s in self.stages}:
            return self.downstream(from_)
        raise UnknownRedriveStageError(run_id, from_, sorted(s.id for s in self.stages))

    def group_of(self, stage_id: str) -> int:
        for i, g in enumerate(self.groups):
            if stage_id in g:
                return i
        raise DefinitionError(f"workflow {self.workflow_id!r} has no stage {stage_id!r}")


Handler = Callable[..., Any]


@dataclass(eq=False)
class Stage:
    """A stage of a workflow; returned by ``@workflow.stage``."""

    id: str
    fn: Handler
    after: tuple[str, ...]
    retry: Retry
    timeout: timedelta | None
    local: bool
    output_type: Any
    workflow_id: str
    compensation_fn: Handler | None = None
    signals: tuple[str, ...] = ()
    after_signal: str | None = None
    after_signal_timeout: timedelta | None = None
    _owner: Workflow[Any] | None = field(default=None, repr=False)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def compensation(self, fn: Handler) -> Handler:
        """Declare ``fn(ctx, output)`` as this stage's compensation (run on saga rollback)."""
        if self.compensation_fn is not None:
            raise DefinitionError(f"stage {self.id!r} already has a compensation")
        if not callable(fn):
            raise DefinitionError(
                f"the compensation of stage {self.id!r} must be a function, not {type(fn).__name__}"
            )
        what = f"the compensation of stage {self.id!r}"
        if self._owner is not None:
            self._owner._mutable(what)
        check_handler(fn, what, "two arguments (ctx, output)", 2)
        self.compensation_fn = fn
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


# the longest timeout: a Temporal timer's or activity timeout's deadline is computed from the
# workflow's clock, and ``timedelta.max`` overflowed there (every workflow task of the run
# failed); a century is past any deadline a run has
_MAX_TIMEOUT = timedelta(days=36525)


def _check_timeout(timeout: object, what: str) -> None:
    if timeout is None:
        return
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise DefinitionError(f"{what}: timeout must be a positive timedelta")
    if timeout > _MAX_TIMEOUT:
        raise DefinitionError(f"{what}: timeout must be at most 100 years (timedelta(days=36525))")


def check_handler(fn: Handler, what: str, takes: str, count: int) -> None:
    """At definition, what would fail every call: a generator (a stage returns its output),
    or a signature that cannot take the ``count`` arguments the runner passes. Found when a
    run reached the stage, a compensation's only when a later stage failed."""
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise DefinitionError(f"{what} is a generator; return its result instead of yielding it")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # (a builtin without a signature: it shows when called)
    try:
        signature.bind(*([None] * count))
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise DefinitionError(f"{what} must take {takes}; it is {name}{signature}") from None


def _return_hint_only(fn: Handler) -> dict[str, Any]:
    """Resolve only the return annotation (the parameters' annotations may name types that
    are imported under ``TYPE_CHECKING`` only, which must not lose the output type)."""
    target = inspect.unwrap(fn) if inspect.isfunction(fn) or inspect.ismethod(fn) else fn
    annotations = getattr(target, "__annotations__", None)
    if not isinstance(annotations, dict) or "return" not in annotations:
        return {}
    holder = types.SimpleNamespace(__annotations__={"return": annotations["return"]})
    try:
        return typing.get_type_hints(holder, globalns=getattr(target, "__globals__", None))
    except Exception:
        return {}


def _return_type(fn: Handler) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = _return_hint_only(fn)
    ret = hints.get("return", Any)
    if ret is type(None):
        return None
    origin = typing.get_origin(ret)
    if origin is not None and origin in (Awaitable, typing.Coroutine):
        args = typing.get_args(ret)
        return args[-1] if args else Any
    return ret


@functools.lru_cache(maxsize=1024)
def _cached_schema(tp: Any) -> dict[str, Any]:
    return TypeAdapter(tp).json_schema()


def _schema_of(tp: Any, what: str) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp is None:
        return {"type": "null"}
    try:
        try:
            cached = _cached_schema(tp)  # stages of one type share one schema (big graphs)
        except TypeError:  # an unhashable annotation
            cached = TypeAdapter(tp).json_schema()
        return copy.deepcopy(cached)
    except Exception as exc:
        raise DefinitionError(
            f"{what} has a return type pydantic cannot describe as JSON ({exc}); return a pydantic "
            "model, a dataclass or plain JSON types"
        ) from None


@dataclass(eq=False)
class Workflow(Generic[InT]):
    """A declarative workflow: a DAG of stages.

    ``version`` is explicit or, when omitted, a hash of the structure (stage ids, dependencies,
    retry and timeout policies, input and output JSON schemas; never the bodies).
    """

    id: str
    input: type[InT]
    version_: str | None = None
    hooks: tuple[str, ...] = ()
    timeout: timedelta | None = None
    _stages: dict[str, Stage] = field(default_factory=dict)

    def __init__(
        self,
        id: str,
        *,
        input: type[InT],
        version: str | None = None,
        hooks: Iterable[str] = (),
        timeout: timedelta | None = None,
    ) -> None:
        if not isinstance(id, str) or not _WF_ID.fullmatch(id):
            raise DefinitionError(
                f"workflow id {id!r} is invalid; use letters, digits, '_' and '-' only"
            )
        check_workflow_id(id, error=definition_error)
        if not (isinstance(input, type) and issubclass(input, BaseModel)):
            raise DefinitionError(f"workflow {id!r}: input= must be a pydantic BaseModel subclass")
        if version is not None and (not isinstance(version, str) or not version):
            raise DefinitionError(f"workflow {id!r}: version must be a non-empty string")
        if version is not None:
            check_version(version, error=definition_error)
        _check_timeout(timeout, f"workflow {id!r}")
        if isinstance(hooks, str):  # one hook point given without a list
            hooks = [hooks]
        self.id = id
        self.input = input
        self.version_ = version
        self.hooks = tuple(check_hook_name(h, error=definition_error) for h in hooks)
        self.timeout = timeout
        self._stages = {}
        self._graph: GraphModel | None = None
        self._graph_key: tuple[Any, ...] | None = None
        # set by Registry.add: the registry keys the workflow by the version it had then
        self._registered = False

    def _mutable(self, what: str) -> None:
        """Refuse a declaration once the workflow is in a Registry: it changes the structure
        (and the structural version) the registry holds it under, so starts found no
        registered version, or an explicit version changed unchecked."""
        if self._registered:
            raise DefinitionError(
                f"cannot add {what} to workflow {self.id!r}: it is already in a Registry, "
                "which holds the structure it had then; declare every stage, compensation and "
                "hook point before Registry([...]) / registry.add(...)"
            )

    # -- definition -------------------------------------------------------------------------
    @overload
    def stage(
        self,
        fn: Handler,
        *,
        id: str | None = None,
        after: Sequence[Stage | str] = (),
        retry: Retry | None = None,
        timeout: timedelta | None = None,
        local: bool = False,
        signals: Iterable[str] = (),
        after_signal: str | None = None,
        after_signal_timeout: timedelta | None = None,
    ) -> Stage: ...

    @overload
    def stage(
        self,
        fn: None = None,
        *,
        id: str | None = None,
        after: Sequence[Stage | str] = (),
        retry: Retry | None = None,
        timeout: timedelta | None = None,
        local: bool = False,
        signals: Iterable[str] = (),
        after_signal: str | None = None,
        after_signal_timeout: timedelta | None = None,
    ) -> Callable[[Handler], Stage]: ...

    def stage(
        self,
        fn: Handler | None = None,
        *,
        id: str | None = None,
        after: Sequence[Stage | str] = (),
        retry: Retry | None = None,
        timeout: timedelta | None = None,
        local: bool = False,
        signals: Iterable[str] = (),
        after_signal: str | None = None,
        after_signal_timeout: timedelta | None = None,
    ) -> Any:
        """Decorator declaring a stage; returns a :class:`Stage`.

        ``signals`` names the signals the stage waits for (``ctx.step.wait_for_signal``).
        Once any stage of a workflow declares its signals, ``engine.signal`` refuses a name
        no stage of the run's version declares (UnknownSignalError); a workflow that declares
        none accepts every name.

        ``after_signal`` names a signal the stage starts on: once its upstream stages
        completed, the stage waits (suspended, ``waiting_for`` ``signal:<name>``) until a
        ``name`` signal is there, then runs its body, whose first
        ``ctx.step.wait_for_signal(name)`` returns that signal's payload at once. The same as
        a body that begins with that wait, but no attempt runs before the signal: on the
        Temporal driver the workflow itself waits (a hand-written ``wait_condition``), no
        activity. The name counts as declared in ``signals``.

        ``after_signal_timeout`` bounds that wait, as ``wait_for_signal(name, timeout=)``
        would: its deadline is fixed when the stage first waits; with no signal by then the
        attempt fails with StepTimeoutError without running its body, and so does every
        later attempt (the timeout is journaled, as an uncaught wait timeout is). Without it
        the wait has no deadline (the run's ``timeout=`` still applies). To handle a timeout
        in code, wait in the body instead and catch StepTimeoutError."""
        if isinstance(signals, str):
            signals = [signals]
        names = tuple(check_signal_name(n, error=definition_error) for n in signals)
        if after_signal is not None:
            if not isinstance(after_signal, str):
                raise DefinitionError(
                    f"after_signal= takes one signal name (a string), not {after_signal!r:.80}"
                )
            names = (*names, check_signal_name(after_signal, error=definition_error))
        if after_signal_timeout is not None and after_signal is None:
            raise DefinitionError(
                "after_signal_timeout= bounds the wait of after_signal=: name the signal the "
                "stage starts on, or drop the timeout"
            )

        if isinstance(after, Stage | str):  # one dependency given without a list
            after = [after]
        if retry is not None and not isinstance(retry, Retry):
            raise DefinitionError(f"retry= must be a Retry(...), not {type(retry).__name__}")

        if not isinstance(local, bool):
            raise DefinitionError(f"local= must be True or False, not {local!r}")

        def register(f: Handler) -> Stage:
            self._mutable(f"stage {id or getattr(f, '__name__', '')!r}")
            if not callable(f):
                named = "" if id is None else f" {id!r}"
                raise DefinitionError(
                    f"stage{named} of workflow {self.id!r} must be a function, not "
                    f"{type(f).__name__}"
                )
            stage_id = self._new_stage_id(id if id is not None else getattr(f, "__name__", ""))
            check_handler(f, f"stage {stage_id!r}", "one argument (ctx)", 1)
            deps = self._dependencies(stage_id, after)
            _check_timeout(timeout, f"stage {stage_id!r}")
            _check_timeout(after_signal_timeout, f"stage {stage_id!r} after_signal_timeout=")
            out = _return_type(f)
            stage = Stage(
                id=stage_id,
                fn=f,
                after=tuple(deps),
                retry=retry or Retry(),
                timeout=timeout,
                local=local,
                output_type=out,
                workflow_id=self.id,
                signals=tuple(sorted(set(names))),
                after_signal=after_signal,
                after_signal_timeout=after_signal_timeout,
                _owner=self,
            )
            self._stages[stage_id] = stage
            self._graph = None
            return stage

        if fn is not None:
            return register(fn)
        return register

    def _new_stage_id(self, stage_id: object) -> str:
        """``stage_id`` checked: well-formed, within the limit, not taken in this workflow."""
        if not isinstance(stage_id, str) or not _ID.fullmatch(stage_id):
            raise DefinitionError(
                f"stage id {stage_id!r} in workflow {self.id!r} is invalid; use letters, "
                "digits, '_' and '-'"
            )
        check_stage_id(stage_id, error=definition_error)
        if stage_id in self._stages:
            raise DefinitionError(
                f"workflow {self.id!r} already has a stage {stage_id!r}; give each stage a "
                "unique id (id=...)"
            )
        return stage_id

    def _dependencies(self, stage_id: str, after: Sequence[Stage | str]) -> list[str]:
        """The ids a stage's ``after=`` names: stages of this workflow, each once, not itself."""
        deps: list[str] = []
        for dep in after:
            if not isinstance(dep, Stage | str):
                raise DefinitionError(
                    f"stage {stage_id!r}: after= takes the stages returned by @wf.stage (or "
                    f"their ids), not {type(dep).__name__} {dep!r:.80}; decorate the function "
                    "with @wf.stage first"
                )
            dep_id = dep.id if isinstance(dep, Stage) else dep
            if isinstance(dep, Stage) and dep.workflow_id != self.id:
                raise DefinitionError(
                    f"stage {stage_id!r} depends on {dep_id!r} of another workflow "
                    f"({dep.workflow_id!r})"
                )
            if dep_id == stage_id:
                raise DefinitionError(f"stage {stage_id!r} cannot depend on itself")
            if dep_id in deps:
                raise DefinitionError(f"stage {stage_id!r} lists {dep_id!r} twice in after=")
            deps.append(dep_id)
        return deps

    def hook_point(self, name: str) -> None:
        """Declare a hook point that ``ctx.hook(name, payload)`` may call."""
        check_hook_name(name, error=definition_error)
        if name not in self.hooks:
            self._mutable(f"hook point {name!r}")
            self.hooks = (*self.hooks, name)
            self._graph = None

    # -- reading ----------------------------------------------------------------------------
    @property
    def stages(self) -> dict[str, Stage]:
        return dict(self._stages)

    def get_stage(self, stage_id: str) -> Stage:
        try:
            return self._stages[stage_id]
        except KeyError:
            raise DefinitionError(f"workflow {self.id!r} has no stage {stage_id!r}") from None

    def groups(self) -> list[list[str]]:
        """The execution groups: topological layers of the DAG (ids sorted within a layer)."""
        if not self._stages:
            raise DefinitionError(f"workflow {self.id!r} has no stages; add one with @wf.stage")
        for s in self._stages.values():
            for d in s.after:
                if d not in self._stages:
                    raise DefinitionError(
                        f"stage {s.id!r} of workflow {self.id!r} depends on unknown stage {d!r}"
                    )
        # Kahn's algorithm: linear in stages + edges (a 3,000-stage chain in milliseconds)
        waiting = {sid: len(set(s.after)) for sid, s in self._stages.items()}
        dependants: dict[str, list[str]] = {sid: [] for sid in self._stages}
        for s in self._stages.values():
            for d in set(s.after):
                dependants[d].append(s.id)
        level: dict[str, int] = {}
        ready = [sid for sid, n in waiting.items() if n == 0]
        while ready:
            sid = ready.pop()
            level[sid] = 1 + max((level[d] for d in self._stages[sid].after), default=-1)
            for nxt in dependants[sid]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    ready.append(nxt)
        if len(level) < len(self._stages):
            cyc = ", ".join(sorted(sid for sid in self._stages if sid not in level))
            raise DefinitionError(
                f"workflow {self.id!r} has a dependency cycle among stages: {cyc}"
            )
        layers: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
        for sid, lv in level.items():
            layers[lv].append(sid)
        return [sorted(layer) for layer in layers]

    def _structure(self) -> dict[str, Any]:
        groups = self.groups()
        stages = [
            StageSpec(
                id=s.id,
                after=list(s.after),
                retry=s.retry.model(),
                timeout_s=None if s.timeout is None else s.timeout.total_seconds(),
                compensable=s.compensation_fn is not None,
                local=s.local,
                output_schema=_schema_of(s.output_type, f"stage {s.id!r}"),
                signals=list(s.signals),
                after_signal=s.after_signal,
                after_signal_timeout_s=None
                if s.after_signal_timeout is None
                else s.after_signal_timeout.total_seconds(),
            )
            for s in sorted(self._stages.values(), key=lambda s: s.id)
        ]
        return {
            "workflow_id": self.id,
            "input_schema": self._input_schema(),
            "stages": stages,
            "groups": groups,
            "hooks": sorted(self.hooks),
            "timeout_s": None if self.timeout is None else self.timeout.total_seconds(),
        }

    def _input_schema(self) -> dict[str, Any]:
        try:
            return self.input.model_json_schema()
        except Exception as exc:  # a field type with no JSON form (arbitrary_types_allowed)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DefinitionError(
                f"workflow {self.id!r}: its input model {self.input.__name__} cannot be "
                f"described as JSON ({first}); a run's input is JSON: give the model fields "
                "of JSON types (str, numbers, bool, lists, dicts, nested models)"
            ) from None

    def _cache_key(self) -> tuple[Any, ...]:
        # everything graph() depends on that can change after a stage was added
        # (a compensation declared later, hooks/timeout/version assigned directly)
        return (
            tuple((s.id, s.compensation_fn is not None) for s in self._stages.values()),
            self.hooks,
            self.timeout,
            self.version_,
        )

    def graph(self) -> GraphModel:
        """The canonical graph model (validates the definition; raises DefinitionError)."""
        key = self._cache_key()
        if self._graph is None or self._graph_key != key:
            structure = self._structure()
            unversioned = GraphModel(version="", **structure)
            version = self.version_ or structural_hash(unversioned)
            self._graph = GraphModel(version=version, **structure)
            self._graph_key = key
        return self._graph

    @property
    def version(self) -> str:
        return self.graph().version

    def validate_input(self, data: Any) -> InT:
        try:
            if isinstance(data, self.input):
                return data
            if isinstance(data, BaseModel):
                data = data.model_dump(mode="json")
            return self.input.model_validate(data)
        except ValidationError as exc:
            fields = tuple(".".join(str(p) for p in e["loc"]) or "<root>" for e in exc.errors())
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidInputError(self.id, detail, fields) from None
        except EngineError:
            raise
        except Exception as exc:  # a validator of the input model that raised something else
            detail = (
                f"the input model {self.input.__name__} raised {type(exc).__name__}: {exc} "
                "(its validators should raise ValueError for input they refuse)"
            )
            raise InvalidInputError(self.id, detail) from exc

    def __repr__(self) -> str:
        return f"Workflow({self.id!r}, stages={list(self._stages)})"


def structural_hash(model: GraphModel) -> str:
    data = model.model_dump_json(exclude={"version"}).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def is_async_handler(fn: Handler) -> bool:
    return inspect.iscoroutinefunction(fn)


StageFn = Callable[["StageContext[Any]"], Any]
