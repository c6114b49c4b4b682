"""The mutant catalogue: small, realistic bugs planted one at a time in the modules that
implement the contract (DESIGN.md §5), to show the conformance suite can fail.

Each mutant is one exact text replacement. ``driver`` says where the bug lives ("port" for
engine_port, shared by both drivers, "native" or "temporal"); ``target`` says which conformance
selection judges it (port and native mutants run against native-sqlite, Temporal mutants
against the Temporal dev server). ``focus`` is an optional pytest ``-k`` expression for the
tests most likely to kill the mutant: the runner tries it first (a quick kill) and runs the
whole selection only if it passes, so the verdict is the same as running the whole selection.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MUTANTS", "Mutant"]


@dataclass(frozen=True)
class Mutant:
    id: str
    driver: str  # "port" | "native" | "temporal"
    file: str
    original: str
    replacement: str
    rule: str  # the contract rule the mutant breaks (one line)
    focus: str | None = None

    @property
    def target(self) -> str:
        return "temporal" if self.driver == "temporal" else "native-sqlite"


def _m(
    id: str, driver: str, file: str, original: str, replacement: str, rule: str, focus: str = ""
) -> Mutant:
    return Mutant(id, driver, file, original, replacement, rule, focus or None)


MUTANTS: tuple[Mutant, ...] = (
    # -- engine_port: the shared stage runner, steps, events, claim check --------------------
    _m(
        "P01-compensation-not-run",
        "port",
        "engine_port/_runner.py",
        "        if stage.compensation_fn is None:\n            return Completed(None)",
        "        if True:\n            return Completed(None)",
        "a compensation is skipped (reported compensated without running its body)",
        "compensation or s4",
    ),
    _m(
        "P02-nonretryable-retried",
        "port",
        "engine_port/_runner.py",
        "retryable = stage.retry.is_retryable(exc) and not isinstance(exc, _NEVER_RETRY)",
        "retryable = not isinstance(exc, _NEVER_RETRY)",
        "a non-retryable error (NonRetryableError / Retry.non_retryable) is retried",
        "non_retryable",
    ),
    _m(
        "P03-listed-nonretryable-retried",
        "port",
        "engine_port/_graph.py",
        "        return not (self.non_retryable and isinstance(error, self.non_retryable))",
        "        return True",
        "a type listed in Retry.non_retryable is retried",
        "non_retryable",
    ),
    _m(
        "P04-stage-timeout-untyped",
        "port",
        "engine_port/_runner.py",
        "            if timeout is not None and scope.expired():",
        "            if False:",
        "a stage over its timeout fails with TimeoutError, not StageTimeoutError",
        "timeout",
    ),
    _m(
        "P05-stage-timeout-ignored",
        "port",
        "engine_port/_runner.py",
        "            async with asyncio.timeout(timeout) as scope:",
        "            async with asyncio.timeout(None) as scope:",
        "a stage timeout is not enforced",
        "timeout",
    ),
    _m(
        "P06-business-events-dropped",
        "port",
        "engine_port/_runner.py",
        "        return Completed(output, tuple(ctx.events))",
        "        return Completed(output, ())",
        "business events from ctx.emit are lost",
        "compensation or s4 or s5",
    ),
    _m(
        "P07-step-not-journaled",
        "port",
        "engine_port/_context.py",
        "        await self._ledger.put(\n"
        '            StepRecord(name=name, kind="run", completed=True, result=value, meta=meta)\n'
        "        )",
        "        pass",
        "a step result is not journaled (the step re-runs on replay)",
        "s6 or s17 or hooks or redrive",
    ),
    _m(
        "P08-failed-step-journaled",
        "port",
        "engine_port/_context.py",
        "            result, meta = await self._staging(functools.partial(fn, *args, **kwargs))\n"
        '        value = to_json_value(result, f"result of step {name!r}")',
        "            try:\n"
        "                result, meta = await self._staging(\n"
        "                    functools.partial(fn, *args, **kwargs)\n"
        "                )\n"
        "            except Exception:\n"
        "                await self._ledger.put(\n"
        '                    StepRecord(name=name, kind="run", completed=True, result=None)\n'
        "                )\n"
        "                raise\n"
        '        value = to_json_value(result, f"result of step {name!r}")',
        "a failed step is journaled as done (its retry replays a result it never produced)",
        "retr or redrive",
    ),
    _m(
        "P09-sleep-deadline-slides",
        "port",
        "engine_port/_context.py",
        '        if rec is None:\n            rec = StepRecord(name=name, kind="sleep"',
        "        if rec is None or not rec.completed:\n"
        '            rec = StepRecord(name=name, kind="sleep"',
        "a durable sleep's deadline is recomputed on every replay (it never ends)",
        "s6 or sleep",
    ),
    _m(
        "P10-waitfor-deadline-slides",
        "port",
        "engine_port/_context.py",
        '        if rec is None:\n            rec = StepRecord(name=name, kind="poll"',
        "        if rec is None or not rec.completed:\n"
        '            rec = StepRecord(name=name, kind="poll"',
        "a wait_for deadline is recomputed on every replay (fixed on first execution)",
        "wait_for",
    ),
    _m(
        "P11-waitfor-overshoots-deadline",
        "port",
        "engine_port/_context.py",
        "        if rec.deadline is not None:\n            until = min(until, rec.deadline)",
        "        pass",
        "a wait_for whose poll interval is longer than its deadline ends late",
        "wait_for",
    ),
    _m(
        "P12-signal-timeout-never",
        "port",
        "engine_port/_context.py",
        "        if rec.deadline is not None and self._clock.now() >= rec.deadline:",
        "        if False:",
        "StepTimeoutError is not raised at a wait_for_signal deadline",
        "s9 or timeout",
    ),
    _m(
        "P13-buffered-signal-not-consumed-first",
        "port",
        "engine_port/_context.py",
        "            taken = await self._ledger.consume_signal(rec)\n"
        "            if taken is not None:\n"
        "                return json_copy(taken.result)\n"
        "            if not gate or deadline is not None:",
        "            if not gate or deadline is not None:",
        "a buffered signal is not consumed by the wait that reaches it (it suspends first)",
        "s8 or signal",
    ),
    _m(
        "P14-spill-at-threshold",
        "port",
        "engine_port/_blobs.py",
        "if not force and len(data) <= self.threshold:",
        "if not force and len(data) < self.threshold:",
        "a value of exactly the spill threshold is spilled (must stay inline)",
        "spill or claim",
    ),
    _m(
        "P15-never-spill",
        "port",
        "engine_port/_blobs.py",
        "if not force and len(data) <= self.threshold:",
        "if not force:",
        "values over the spill threshold stay inline (claim check off)",
        "claim or spill",
    ),
    _m(
        "P16-random-event-ids",
        "port",
        "engine_port/_events.py",
        "    return hashlib.sha256(raw.encode()).hexdigest()[:32]",
        '    return __import__("uuid").uuid4().hex',
        "event ids are random instead of a deterministic function of the run's history",
        "event_ids or s17",
    ),
    _m(
        "P17-started-id-ignores-attempt",
        "port",
        "engine_port/_lifecycle.py",
        '            self._id("stage.started", stage, attempt), "stage.started", stage, '
        '{"attempt": attempt}',
        '            self._id("stage.started", stage), "stage.started", stage, '
        '{"attempt": attempt}',
        "two attempts of a stage emit stage.started with one id (the retry's start is lost)",
        "s3",
    ),
    _m(
        "P18-business-ids-collide",
        "port",
        "engine_port/_lifecycle.py",
        '        return EventDraft(self._id("business", stage, index), type, stage, data, '
        "business=True)",
        '        return EventDraft(self._id("business", stage), type, stage, data, business=True)',
        "several business events of one stage share an id (all but one are lost)",
        "delivery or s5 or compensation",
    ),
    _m(
        "P19-will-retry-always",
        "port",
        "engine_port/_lifecycle.py",
        '            "will_retry": will_retry,',
        '            "will_retry": True,',
        "stage.failed reports will_retry=True on the final failure",
        "s3",
    ),
    _m(
        "P20-run-output-wrong-stage",
        "port",
        "engine_port/_lifecycle.py",
        "        return outputs.get(sinks[0])",
        "        return outputs.get(sorted(outputs)[0]) if outputs else None",
        "the run output is taken from the wrong stage (not the sink)",
        "s1",
    ),
    # -- driver_native: the command kernel's transactions ---------------------------------------
    _m(
        "N01-compensation-order-reversed",
        "native",
        "driver_native/_progress.py",
        "        .order_by(stages.c.completed_order.desc())",
        "        .order_by(stages.c.completed_order)",
        "compensations run in completion order instead of reverse completion order",
        "s4",
    ),
    _m(
        "N02-newest-compensation-skipped",
        "native",
        "driver_native/_progress.py",
        "        todo=[(r.stage_id, r.output) for r in rows if r.stage_id in compensable],",
        "        todo=[(r.stage_id, r.output) for r in rows[1:] if r.stage_id in compensable],",
        "the most recently completed stage is not compensated",
        "s4",
    ),
    _m(
        "N03-business-released-on-failure",
        "native",
        "driver_native/_progress.py",
        "    conn.execute(sa.delete(staged_events).where(staged_events.c.run_id == run.id))\n"
        "    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))",
        "    released = [\n"
        "        lc.business(r.stage_id, r.idx, r.type, r.data)\n"
        "        for r in conn.execute(\n"
        "            sa.select(staged_events).where(staged_events.c.run_id == run.id)\n"
        "        ).all()\n"
        "    ]\n"
        "    append_events(conn, run, released, now)\n"
        "    conn.execute(sa.delete(staged_events).where(staged_events.c.run_id == run.id))\n"
        "    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))",
        "staged business events are released when the run fails or is cancelled",
        "s5 or cancel or compensation",
    ),
    _m(
        "N04-business-not-discarded",
        "native",
        "driver_native/_progress.py",
        "    conn.execute(sa.delete(staged_events).where(staged_events.c.run_id == run.id))\n"
        "    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))",
        "    conn.execute(sa.delete(jobs).where(jobs.c.run_id == run.id))",
        "staged business events are not discarded on compensation/cancel (a redrive of the "
        "run later releases them)",
        "redrive or cancel or s5",
    ),
    _m(
        "N05-attempt-bumped-on-takeover",
        "native",
        "driver_native/_progress.py",
        "        attempt = stage.attempt  # resuming (after a sleep, a signal, a poll or a crash)",
        "        attempt = stage.attempt + (stage.status == StageStatus.RUNNING)",
        "the attempt number the body sees is incremented when a crashed attempt is taken over",
        "takeover or s17",
    ),
    _m(
        "N06-backoff-exponent",
        "port",
        "engine_port/_graph.py",
        "self.initial_interval_s * self.backoff ** max(0, attempt - 1)",
        "self.initial_interval_s * self.backoff ** attempt",
        "retry backoff exponent off by one (the first retry waits initial*backoff)",
        "configured_delay or s3",
    ),
    _m(
        "N07-backoff-not-applied",
        "native",
        "driver_native/_progress.py",
        "        due = a.now + spec.retry.delay_s(attempt)",
        "        due = a.now",
        "a retry is scheduled at once, without its backoff",
        "s3",
    ),
    _m(
        "N08-max-attempts-off-by-one",
        "native",
        "driver_native/_progress.py",
        "    will_retry = outcome.retryable and attempt < spec.retry.max_attempts",
        "    will_retry = outcome.retryable and attempt <= spec.retry.max_attempts",
        "a stage gets max_attempts + 1 attempts",
        "s3",
    ),
    _m(
        "N09-started-twice-on-resume",
        "native",
        "driver_native/_progress.py",
        "        _set_stage(conn, run.id, stage.stage_id, status=StageStatus.RUNNING, "
        "waiting_for=None)",
        "        _set_stage(conn, run.id, stage.stage_id, status=StageStatus.RUNNING, "
        "waiting_for=None)\n"
        "        drafts.append(lc.stage_started(stage.stage_id, attempt))",
        "stage.started is emitted again when a suspended stage resumes",
        "s6 or sleep or signal",
    ),
    _m(
        "N10-completed-before-business",
        "native",
        "driver_native/_schedule.py",
        "    drafts = [life.business(r.stage_id, r.idx, r.type, r.data) for r in staged]\n"
        "    drafts.append(life.run_completed())",
        "    drafts = [life.run_completed()]\n"
        "    drafts += [life.business(r.stage_id, r.idx, r.type, r.data) for r in staged]",
        "run.completed is published before the run's business events",
        "s5 or compensation",
    ),
    _m(
        "N11-business-order",
        "native",
        "driver_native/_schedule.py",
        "        .order_by(stages.c.completed_order, staged_events.c.idx)",
        "        .order_by(stages.c.completed_order.desc(), staged_events.c.idx)",
        "business events are released newest stage first",
        "delivery or s5 or compensation",
    ),
    _m(
        "N12-cancel-between-attempts-skipped",
        "native",
        "driver_native/_progress.py",
        "        return bool(stage.attempt)",
        "        return False",
        "a stage cancelled between a failed attempt and its retry ends skipped without "
        "stage.cancelled",
        "cancel",
    ),
    _m(
        "N13-run-output-first-group",
        "native",
        "driver_native/_schedule.py",
        "        output=run_output(sinks, outputs),",
        "        output=run_output(shape.groups[0], outputs),",
        "the run output is taken from the first stage instead of the sink",
        "s1 or s2",
    ),
    _m(
        "N14-suspension-id",
        "port",
        "engine_port/_lifecycle.py",
        '        which = (n,) if step is None else (step, at or "")',
        "        which = (n,) if step is None else (step,)",
        "every poll of one wait_for gets the same event id (the later ones are lost)",
        "delivery or wait_for or sleep",
    ),
    _m(
        "N15-idempotency-conflict-not-raised",
        "native",
        "driver_native/_runs.py",
        "                raise IdempotencyConflictError(key, existing.id)",
        "                return existing.id, False",
        "the same idempotency key with a different input returns the old run",
        "idempot or s11",
    ),
    _m(
        "N16-idempotency-second-run",
        "native",
        "driver_native/_runs.py",
        "    if key is not None:\n        existing = got[1].first()",
        "    if key is not None and False:\n        existing = got[1].first()",
        "a repeated idempotency key creates a second run",
        "idempot or s11",
    ),
    _m(
        "N17-redrive-reruns-upstream",
        "port",
        "engine_port/_graph.py",
        "            return self.downstream(from_)",
        "            return {s.id for s in self.stages}",
        "redrive from a stage re-runs its completed upstream stages",
        "redrive",
    ),
    _m(
        "N18-redrive-drops-ledger",
        "native",
        "driver_native/_runs.py",
        '    if from_ != "last_failure":\n        conn.execute(\n            sa.delete(steps)',
        "    if True:\n        conn.execute(\n            sa.delete(steps)",
        "redrive from the last failure drops the resumed stage's step ledger",
        "redrive",
    ),
    _m(
        "N19-buffered-signal-dropped",
        "native",
        "driver_native/_runs.py",
        '        "consumed": False,\n        "received_at": now,',
        '        "consumed": run.status == "running",\n        "received_at": now,',
        "a signal sent while the run is running (before its wait) is dropped",
        "s8 or signal",
    ),
    _m(
        "N20-outbox-newest-first",
        "native",
        "driver_native/_outbox.py",
        "query.order_by(outbox.c.id).limit(limit)",
        "query.order_by(outbox.c.id.desc()).limit(limit)",
        "the outbox delivers events newest first",
        "delivery or dlq or sink",
    ),
    _m(
        "N21-outbox-seq-off-by-one",
        "native",
        "driver_native/_outbox.py",
        "    first = seq - len(drafts) + 1",
        "    first = seq - len(drafts)",
        "per-run sequence numbers start at 0 and collide between transactions",
        "s1",
    ),
    _m(
        "N22-step-result-not-spilled",
        "native",
        "driver_native/_ledger.py",
        "            stored = await self._claim.dump(record.result, key)",
        "            stored = record.result",
        "a large step result is stored inline in the database",
        "claim",
    ),
    _m(
        "N23-pinned-version-ignored",
        "native",
        "driver_native/_jobs.py",
        '        cond.append(jobs.c.wfv.in_(in_binds(served, "served")) if served else sa.false())',
        "        pass",
        "a worker runs jobs of (workflow, version) pairs it does not serve",
        "version or s13",
    ),
    _m(
        "N24-stale-lease-never-reaped",
        "native",
        "driver_native/_jobs.py",
        '.where(jobs.c.status == "leased", jobs.c.lease_expires_at < clock)',
        '.where(jobs.c.status == "leased", jobs.c.lease_expires_at < clock - 1e6)',
        "the lease of a dead worker is never taken over (crash not recovered)",
        "s17",
    ),
    _m(
        "N25-compensation-retries-off-by-one",
        "native",
        "driver_native/_kernel.py",
        "            if outcome.retryable and attempt < stage.retry.max_attempts:",
        "            if outcome.retryable and attempt <= stage.retry.max_attempts:",
        "a failing compensation is tried max_attempts + 1 times",
        "s5 or compensation",
    ),
    _m(
        "N26-cancel-terminal-noop",
        "native",
        "driver_native/_runs.py",
        '        raise RunNotActiveError(run_id, run.status, "cancel", migrated_to=run.'
        "migrated_to)",
        "        return False",
        "cancelling a completed or failed run is silently accepted",
        "cancel",
    ),
    # -- driver_temporal: the interpreter workflow and its activities -----------------------------
    _m(
        "T01-compensation-order",
        "temporal",
        "driver_temporal/_workflow.py",
        "        for st in sorted(done, key=lambda s: s.order or 0, reverse=True):",
        "        for st in sorted(done, key=lambda s: s.order or 0):",
        "compensations run in completion order instead of reverse",
        "s4",
    ),
    _m(
        "T02-first-compensation-skipped",
        "temporal",
        "driver_temporal/_workflow.py",
        "            if not spec.compensable:\n                continue\n            attempt = 1",
        "            if not spec.compensable or st.order == 1:\n                continue\n"
        "            attempt = 1",
        "the first completed stage is never compensated",
        "s4",
    ),
    _m(
        "T03-backoff-not-applied",
        "temporal",
        "driver_temporal/_workflow.py",
        '        await self._pause(self._delay(sid, attempt), f"retry {sid}")',
        '        await self._pause(0.001, f"retry {sid}")',
        "a retry starts at once, without its backoff",
        "configured_delay or s3",
    ),
    _m(
        "T04-backoff-exponent",
        "temporal",
        "engine_port/_graph.py",
        "self.initial_interval_s * self.backoff ** max(0, attempt - 1)",
        "self.initial_interval_s * self.backoff ** attempt",
        "retry backoff exponent off by one",
        "configured_delay or s3",
    ),
    _m(
        "T05-max-attempts-off-by-one",
        "temporal",
        "driver_temporal/_workflow.py",
        'bool(res.get("retryable")) and attempt < self._graph.stage(sid).retry.max_attempts',
        'bool(res.get("retryable")) and attempt <= self._graph.stage(sid).retry.max_attempts',
        "a stage gets max_attempts + 1 attempts",
        "s3",
    ),
    _m(
        "T06-completed-before-business",
        "temporal",
        "driver_temporal/_workflow.py",
        '        if outcome == "completed":\n'
        "            done = [s for s in self._stages.values() if s.order]\n"
        "            for st in sorted(done, key=lambda s: s.order or 0):\n"
        "                for i, e in enumerate(st.events):\n"
        '                    self._emit(self._lc.business(st.id, i, e["type"], e["data"]))\n'
        "            self._emit(self._lc.run_completed())",
        '        if outcome == "completed":\n'
        "            self._emit(self._lc.run_completed())\n"
        "            done = [s for s in self._stages.values() if s.order]\n"
        "            for st in sorted(done, key=lambda s: s.order or 0):\n"
        "                for i, e in enumerate(st.events):\n"
        '                    self._emit(self._lc.business(st.id, i, e["type"], e["data"]))',
        "run.completed is published before the run's business events",
        "s5 or compensation",
    ),
    _m(
        "T07-business-released-on-failure",
        "temporal",
        "driver_temporal/_workflow.py",
        '        if outcome == "completed":\n'
        "            done = [s for s in self._stages.values() if s.order]\n",
        "        for st in sorted(self._stages.values(), key=lambda s: s.order or 0):\n"
        '            for i, e in enumerate(st.events if outcome != "completed" else []):\n'
        '                self._emit(self._lc.business(st.id, i, e["type"], e["data"]))\n'
        '        if outcome == "completed":\n'
        "            done = [s for s in self._stages.values() if s.order]\n",
        "staged business events are released when the run fails or is cancelled",
        "s5 or cancel or compensation",
    ),
    _m(
        "T08-nonretryable-retried",
        "temporal",
        "driver_temporal/_activities.py",
        'kind="failed", error=outcome.error.model_dump(), retryable=outcome.retryable',
        'kind="failed", error=outcome.error.model_dump(), retryable=True',
        "a non-retryable failure is retried",
        "non_retryable",
    ),
    _m(
        "T09-attempt-bumped-on-activity-retry",
        "temporal",
        "driver_temporal/_activities.py",
        '            attempt=task["attempt"],',
        '            attempt=task["attempt"] + info.attempt - 1,',
        "the attempt number the body sees grows when Temporal retries a lost activity",
        "takeover or s17",
    ),
    _m(
        "T10-journal-not-read-on-retry",
        "temporal",
        "driver_temporal/_activities.py",
        '        if info.attempt > 1 or info.is_local or task.get("reset"):',
        '        if info.is_local or task.get("reset"):',
        "a retried activity does not replay the steps its lost try journaled",
        "s17",
    ),
    _m(
        "T11-step-not-reported",
        "temporal",
        "driver_temporal/_activities.py",
        "        await super().put(record)\n        self.journal[record.name] = data",
        "        await super().put(record)",
        "a journaled step is not reported to the workflow (re-runs on the next attempt/resume)",
        "s6 or hooks or redrive or sleep",
    ),
    _m(
        "T12-started-twice-on-resume",
        "temporal",
        "driver_temporal/_workflow.py",
        '        else:\n            st.status, st.waiting_for, st.wake_at = "running", None, None',
        '        else:\n            st.status, st.waiting_for, st.wake_at = "running", None, None\n'
        "            self._emit(self._lc.stage_started(sid, st.attempt))",
        "stage.started is emitted again (same id) when a suspended stage resumes",
        "delivery or s6 or sleep",
    ),
    _m(
        "T13-idempotency-conflict-not-raised",
        "temporal",
        "driver_temporal/_engine.py",
        "                raise IdempotencyConflictError(idempotency_key, run_id)",
        "                pass",
        "the same idempotency key with a different input returns the old run",
        "idempot or s11",
    ),
    _m(
        "T14-cancelled-stage-no-event",
        "temporal",
        "driver_temporal/_workflow.py",
        "                self._emit(self._lc.stage_cancelled(sid))",
        "                pass",
        "a stage stopped by cancel/failure emits no stage.cancelled",
        "cancel or s10",
    ),
    _m(
        "T15-compensation-retries-off-by-one",
        "temporal",
        "driver_temporal/_workflow.py",
        "                    and attempt < spec.retry.max_attempts\n                ):",
        "                    and attempt <= spec.retry.max_attempts\n                ):",
        "a failing compensation is tried max_attempts + 1 times",
        "s5 or compensation",
    ),
    _m(
        "T16-business-not-cleared",
        "temporal",
        "driver_temporal/_workflow.py",
        "            st.events = []\n        self._status = outcome",
        "            pass\n        self._status = outcome",
        "staged business events are not discarded at the end (a redrive releases them again)",
        "redrive",
    ),
)
