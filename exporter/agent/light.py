"""The light agent: engine steps and CUDA-graph counts from Python hooks, sent every flush_s, no CUPTI.

The agent's thread wakes every `flush_s`, takes the steps the engine's thread counted since (with
the batch and the scheduler's counts of that moment), the step totals and the graph counters (a
few reads and one small JSON datagram: tens of microseconds with the GIL) and sends them, dropping
rather than blocking. It never loads libcupti nor imports a CUPTI module.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from exporter import wire
from exporter.agent import hooks, plugins
from exporter.agent.sender import Sender
from exporter.agent.settings import Settings
from exporter.agent.steps import StepTracker
from exporter.agent.switch import SWITCH, Switch
from exporter.agent.timer import WakeTimer

STEPS_PER_MESSAGE = 8
QUIET_AFTER = 2  # ticks in a row with nothing the hooks see, then the agent goes quiet
QUIET_BEAT_MIN_S = 0.2  # a quiet beat (settings.quiet_beat_s) comes no more often than this
NEVER_NS = 1 << 62  # an idle wake of "never": a timer ~146 years ahead (as an absolute timerfd time)
# steps counted before the engine stopped and sent when it steps again are dropped past this age (the
# sidecar refuses steps that end over 600 s before it receives them: exporter.sources.agent_feed)
STALE_STEPS_S = 300.0
HEARTBEAT_S = 1.0  # a tick that counted nothing sends at most this often (a heartbeat)
PHASE_YIELD_S = 50e-6  # the agent's thread sleeps this long between its tick's phases (the GIL handed back)


class LightAgent:
    """One process's light agent: hooks in, per-window totals out."""

    def __init__(
        self,
        settings: Settings | None = None,
        steps: StepTracker | None = None,
        sender: Sender | None = None,
        switch: Switch | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        """wall_ns: the clock the steps' ends are on (CLOCK_REALTIME), against which stale ones are dropped."""
        self.settings = settings or Settings.from_env()
        self._wall_ns = wall_ns
        self.state = "stopped"
        self.mode = "light"
        self.detail = self.settings.rejected_detail()
        self.lib_text = ""
        self.steps = steps or StepTracker()
        self.steps.lag_ns = 0  # no CUPTI windows to wait for: steps are ready when they end
        self.steps.per_step = False  # fold steps into totals as they are recorded
        self.sender = sender or Sender(self.settings.socket)
        self.graphs = hooks.GraphReader()
        self.switch = switch or SWITCH  # the hooks this agent swaps in and out (this process's)
        self.tick_ns_max = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_send_ns = 0
        # the last message carried counts: the first tick after it that counts nothing sends at once (the
        # drop to nothing is news: an engine gone eager replays no graph, and its graph-step share reads
        # 0 a heartbeat sooner: bench/README.md, session 29); the empty ticks after it wait for the heartbeat
        self._counted_last = False
        self._timer: WakeTimer | None = None
        self.wakes = 0  # the agent thread's wake-ups (each takes the GIL from whoever runs)
        self.inline = self.settings.inline != "off"  # the engine's step drives the cycle where it can
        self.idle_ticks = 0  # ticks in a row that saw no step, replay or capture
        self._seen = hooks.counts()
        self.quiets = 0  # times the agent went quiet
        # step records dropped as older than STALE_STEPS_S when taken (a long stop); each message carries it
        self.steps_stale = 0
        # how long the sidecar may hear nothing from a running agent before it reads it as quiet: a
        # message goes out each tick that counted anything (a step, a replay, a capture), and the
        # thread does not wake to say the engine stopped (idle_wake_s): two ticks and a quarter second
        # (1.25 s by default); 0 where the thread wakes. An engine whose ticks count nothing (one too
        # slow to keep the idle wake) has its thread tick, and say quiet after QUIET_AFTER of them.
        flush = self.settings.flush_s
        wakes_late = self.inline and self.settings.idle_wake_s > 0
        self.silent_ms = int((2 * flush + 0.25) * 1000) if wakes_late else 0

    def start(self) -> str:
        """Install the hooks and start the agent's thread; return 'running', never raise."""
        if self.state == "running":
            return self.state
        hooks.install()
        self.state = "running"
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="boundwatch-agent", daemon=True)
        self._thread.start()
        return self.state

    def _loop(self) -> None:
        # Every wake-up takes the GIL from the engine's thread (130-145 us on the H200's VM, even where
        # the engine lets go of it in each op; bench/README.md): one per flush_s, and one more where the
        # hooks are sampled (in for hook_share of each tick, then out: exporter.agent.switch). After its
        # first cycle (whose tick loads what ticks need once), the engine's own step drives the cycle
        # (or, hooks held, the ticks) where a driver site exists, and this thread sleeps on a timer the
        # engine keeps pushing; where nothing the hooks see happens, it goes quiet and sleeps until it does.
        share = self.settings.hook_share
        sw = self.switch
        cycling = share < 1.0 and sw.start_cycle()
        out_s, in_s = self.settings.flush_s * (1.0 - share), self.settings.flush_s * share
        try:
            while True:
                if cycling and sw.cycling:
                    if self._wait(out_s):
                        break
                    sw.set_in(True)
                    if self._wait(in_s):
                        break
                    sw.set_in(False)
                elif self._wait(self.settings.flush_s):
                    break
                self._tick_timed()
                if self.inline and self._driven(out_s, in_s):
                    break
        finally:
            sw.undrive()
            if cycling:
                sw.stop_cycle()  # hooks in for good: a CUPTI agent taking over times every step

    def _wait(self, seconds: float) -> bool:
        stopped = self._stop.wait(seconds)
        self.wakes += 0 if stopped else 1
        return stopped

    def _tick_timed(self) -> None:
        """The agent thread's tick (the engine's thread runs its own through the switch); never raises."""
        self.switch.finish_pending()  # the engine's thread no longer drives: a tick it began ends here
        t = time.perf_counter_ns()
        try:
            self.tick()
        except Exception as exc:  # never let the thread die silently
            self.detail = f"agent loop: {type(exc).__name__}: {exc}"[:400]
        self.tick_ns_max = max(self.tick_ns_max, time.perf_counter_ns() - t)

    def _driven(self, out_s: float, in_s: float) -> bool:
        """Hand the cycle to the engine's step and sleep on the timer; True once stopped, False if it cannot.

        Once QUIET_AFTER ticks in a row saw nothing (no step, replay or capture), say so in one message
        and go quiet: the hooks stay in, nothing is swapped or sent, and this thread sleeps until a
        driving call (an engine step, a replay) resumes the cycle on the engine's own thread.

        With idle_wake_s, the drives of an engine that steps fast (switch.FAST_STEP_NS) keep this
        thread's timer at least half that far ahead (set again only once it comes nearer: each set is
        a syscall): it wakes only once the engine has not stepped for between half that and that
        long, then ticks once (what was counted before the engine stopped) and goes quiet at once.
        By default the idle wake is never: the timer is set once, ~146 years ahead, and this thread
        takes no GIL from an engine that stopped stepping (each take cost the engine's thread a
        0.1-0.2 ms pause on the lent H200 and H100: bench/README.md, session 27); the engine's next
        step catches up on its own call (exporter.agent.switch) and sends what was counted before
        the stop (dropped past STALE_STEPS_S). A slow engine keeps the timer a margin past each due
        (one step may outlast a slice). The sidecar reads a light agent silent past the silent_ms of
        its messages, its process alive, as quiet; the quiet beat (settings.quiet_beat_s, off by
        default) says so again for a sidecar started while the engine idles.
        """
        timer = self._timer = self._timer or WakeTimer.make()
        if timer is None:
            return False
        sw = self.switch
        # how late the engine's step may come before this thread swaps: half a slice (31 ms by default),
        # so an engine stepping faster than that never has this thread take the GIL from it
        margin = max(int(in_s * 1e9) // 2, 5_000_000)
        idle_wake = _ns(self.settings.idle_wake_s)
        args: tuple[int, int, int, Any, Any] = (
            int(out_s * 1e9),
            int(in_s * 1e9),
            margin,
            self._inline_tick,
            timer.at,
        )
        if self.idle_ticks >= QUIET_AFTER:
            self._go_quiet(args, idle_wake)
        elif not sw.drive_inline(*args, idle_wake_ns=idle_wake):
            return False
        while sw.driving:
            if self._stop.is_set():
                return True
            if not timer.wait():  # stopped, or the timer failed: the thread swaps by itself again
                sw.undrive()
                return self._stop.is_set()
            self.wakes += 1
            if sw.quiet:  # the quiet beat (a step that resumed the cycle has set the timer past its due)
                if hooks.counts() != self._seen:  # the hooks (in) saw something no driver site did
                    self._tick_timed()
                self._say_quiet()
                beat = self._beat_ns()
                timer.at(time.monotonic_ns() + beat if beat else 0)
                continue
            due, idle = sw.due[0], sw.idle_armed
            sw.drive(by_thread=True)  # the engine did not step past the due: swap (and tick) from here
            # the idle wake (a fast engine that stopped): quiet at once; a rescue (a slow engine's step
            # outlasting its slice) goes on as before, quiet only after QUIET_AFTER empty ticks
            if (idle or self.idle_ticks >= QUIET_AFTER) and not sw.quiet:
                self._go_quiet(args, idle_wake)
            elif sw.due[0] == due:  # nothing was due (the engine swapped meanwhile) or the lock was taken
                timer.at(due + margin)
            elif due == 1 and sw.due[0] > 1:  # this thread ran the rest of a tick the engine's step began:
                timer.at(sw.due[0] + margin)  # the due it restored, no rearm with it (the engine stepped by)
        return self._stop.is_set()

    def _go_quiet(self, args: tuple[int, int, int, Any, Any], idle_wake: int = 0) -> None:
        """Send the quiet message, then let the switch hold the hooks in until a driving call resumes.

        The call that resumes sends a "running" message built here (one datagram, no counts), so the
        sidecar stops counting this agent's silence as no replay as soon as its engine calls again:
        its first tick with counts comes a slice or more later, and the sidecar would have read the
        steps of a burst between as eager (bench/README.md, session 32).
        """
        self.switch.finish_pending()
        self._say_quiet()
        self.quiets += 1
        self.switch.drive_inline(
            *args, quiet=True, beat_ns=self._beat_ns(), idle_wake_ns=idle_wake, on_resume=self._resumer()
        )

    def _resumer(self) -> Callable[[], object] | None:
        """Return what sends the "running" message a resumed cycle says first (built now), None if it cannot be built."""
        try:
            data = self.sender.encode(self._message([], None))
        except Exception:
            return None
        if data is None:
            return None
        send = self.sender.send_data
        return lambda: send(data)

    def _beat_ns(self) -> int:
        """Return the quiet beat's period in ns (settings.quiet_beat_s, at least QUIET_BEAT_MIN_S), 0 for none."""
        beat = self.settings.quiet_beat_s
        return int(max(beat, QUIET_BEAT_MIN_S) * 1e9) if beat > 0 else 0

    def _say_quiet(self) -> None:
        try:
            self.sender.send_data(self.sender.encode(self._message([], None, state="quiet")))
        except Exception:
            pass

    def tick(self, force: bool = False, final: bool = False) -> None:
        """Send what the hooks counted since the last tick (the first tick that counts nothing after one that
        counted too; then a heartbeat once a second while nothing).

        The GIL is handed back between phases (a short sleep: a thread waiting for it takes it at once),
        so no other thread waits on a whole tick (where the engine drives the cycle, its own thread runs
        `phases` one per call: exporter.agent.switch).
        """
        for _ in self.phases(force, final):
            time.sleep(PHASE_YIELD_S)

    def phases(self, force: bool = False, final: bool = False) -> Iterator[None]:
        """The tick in parts, each a few tens of microseconds with every cache cold (it pauses between them).

        On the engine's thread each part is one pause of the engine's: the scale, each engine's hand-over,
        the step totals taken in parts (StepTracker.take_phased), the graph counts, then each message
        built, encoded and sent apart.
        """
        scale = self.switch.scale()  # what the counts since stand for, the hooks having been in a slice of it
        self.switch.check_direct()  # torch's C++ replay still the one the hooks call (held in: no swap sees)
        yield
        yield from plugins.flush_phases(self.steps, 0)  # every engine's steps since the last hand-over
        steps = yield from self.steps.take_phased(scale)
        if steps:
            steps = self._fresh(steps)
        seen = hooks.counts()
        counted = bool(steps) or seen != self._seen
        self.idle_ticks = 0 if counted else self.idle_ticks + 1
        self._seen = seen
        now = time.monotonic_ns()
        if (
            not counted
            and not force
            and not self._counted_last
            and now - self._last_send_ns < HEARTBEAT_S * 1e9
        ):
            self.graphs.count(scale)  # sent with the next message, each tick's at its own scale
            return
        self._last_send_ns, self._counted_last = now, counted
        yield
        graphs = self.graph_counts(scale)
        yield
        yield from self._sends(steps, graphs)

    def _fresh(self, steps: list[wire.Steps]) -> list[wire.Steps]:
        """Drop the step records that ended over STALE_STEPS_S ago (counted before a long stop), counting them."""
        oldest = self._wall_ns() - int(STALE_STEPS_S * 1e9)
        fresh = [s for s in steps if not s.t1 or s.t1 >= oldest]
        self.steps_stale += len(steps) - len(fresh)
        return fresh

    def _inline_tick(self) -> Iterator[None]:
        """The tick as the engine's thread runs it (exporter.agent.switch), its failure kept as detail."""
        try:
            yield from self.phases()
        except Exception as exc:
            self.detail = f"agent tick: {type(exc).__name__}: {exc}"[:400]
        if threading.current_thread() is not self._thread:
            self.idle_ticks = 0  # the engine's own thread ran this tick: it steps

    def graph_counts(self, scale: float = 1.0) -> wire.GraphCounts | None:
        """Return the graph counters' window since the last call, None while the hooks are not installed."""
        win = self.graphs.take(scale=scale)
        if win is None:
            return None
        dev = hooks.device()
        return wire.GraphCounts(
            t0=win.t0,
            t1=win.t1,
            replays=win.replays,
            captures=win.captures,
            dev=dev,
            uuid=self.graphs.uuid(dev),
        )

    def send(self, steps: list[wire.Steps], graphs: wire.GraphCounts | None) -> None:
        """Send steps in messages of a few entries each, the graph counts on the first."""
        for _ in self._sends(steps, graphs):
            time.sleep(0)

    def _sends(self, steps: list[wire.Steps], graphs: wire.GraphCounts | None) -> Iterator[None]:
        """Encode and send the messages one by one, pausing after each encoding and between messages."""
        chunks = [steps[i : i + STEPS_PER_MESSAGE] for i in range(0, len(steps), STEPS_PER_MESSAGE)] or [[]]
        for i, chunk in enumerate(chunks):
            if i:
                yield
            msg = self._message(chunk, graphs if i == 0 else None)
            yield
            data = self.sender.encode(msg)
            yield
            self.sender.send_data(data)

    def _message(
        self, steps: list[wire.Steps], graphs: wire.GraphCounts | None, state: str = ""
    ) -> wire.Message:
        return wire.Message(
            pid=os.getpid(),
            state=state or self.state,
            seq=self.sender.next_seq(),
            role=self.settings.role,
            detail=self.detail,
            mode=self.mode,
            steps=tuple(steps),
            graphs=graphs,
            sent_dropped=self.sender.dropped,
            steps_stale=self.steps_stale,
            settings_rejected=len(self.settings.rejected),
            silent_ms=self.silent_ms,
        )

    def detach(self) -> None:
        """Stop the thread without a final message (the CUPTI agent takes over steps and sender)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.wake()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        self.switch.finish_pending()  # a tick the engine's thread had begun: its messages go too

    def stop(self) -> None:
        """Send what is left and a 'stopped' message; safe to call twice."""
        if self._thread is None and self.state == "stopped":
            return
        self.detach()
        try:
            self.tick(force=True, final=True)
        except Exception:
            pass
        self.state = "stopped"
        try:
            self.send([], None)
        except Exception:
            pass
        self.sender.close()

    def describe(self) -> dict[str, Any]:
        """Return what the agent counted about itself (for benchmarks and agent-check)."""
        replays, captures, begun = hooks.counts()
        return {
            "mode": self.mode,
            "state": self.state,
            "hooks": hooks.installed(),
            "replay_direct": hooks.replay_direct(),
            "replays_exact": hooks.replays_exact(),  # every replay counted (not a sample of them)
            "graphs_so_far": hooks.graphs_so_far(),
            "replays": replays,
            "captures": captures,
            "captures_begun": begun,
            "messages_sent": self.sender.sent,
            "messages_dropped": self.sender.dropped,
            "tick_ns_max": self.tick_ns_max,
            "wakes": self.wakes,
            "hooks_driven": self.switch.driving,
            "hook_share": self.settings.hook_share,
            "hooks_cycling": self.switch.cycling,
            "hooks_held": self.switch.held,
            "phases_after_launch": self.switch.after_launch,
            "quiet": self.switch.quiet,
            "quiets": self.quiets,
            "steps_stale": self.steps_stale,
        }


def _ns(seconds: float) -> int:
    """Return seconds in ns; an infinite time ("never") as NEVER_NS."""
    return NEVER_NS if seconds == float("inf") else int(seconds * 1e9)
