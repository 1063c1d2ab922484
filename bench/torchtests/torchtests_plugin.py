"""pytest plugin of bench/torchtests/run.sh (loaded with -p torchtests_plugin).

Selection by test name. --tt-include graph selects the tests whose name
contains "graph"; --tt-include a,b --tt-exclude c those whose name contains a
or b and not c. The name is the test method's name as collected (with the
suffix that PyTorch's parametrization adds), lower-cased; with
--tt-match-class it is "Class.name". Unlike pytest's -k, nothing else takes
part: not the file or folder names, nor the attributes that PyTorch's
decorators set on test functions (-k matches those too: a test decorated
with skipCUDANonDefaultStreamIf carries the keyword
"_do_cuda_non_default_stream", which contains "stream").

A record of the run, one JSON object a line, appended to --tt-record
(flushed line by line, so it survives a crash of the process):
  {"event": "selected", "attempt": N, "keys": [...]}   after collection
  {"event": "start", "key": K, "nodeid": ID, "attempt": N}
  {"event": "report", "key": K, "when": "call", "outcome": "failed",
   "message": "first line"}
  {"event": "finish", "key": K}
  {"event": "session_finish", "attempt": N, "exitstatus": S}
run.sh adds {"event": "process_end", "attempt": N, "rc": RC} after each
process. K is "Class::name".

Resuming: when the record already holds earlier attempts, the tests that
finished there are deselected, and so is a test that started and never
finished: the process died during it (a crash, or the watchdog below).
That test gets {"event": "crashed", "key": K, "rc": RC} and is not run
again, so run.sh can start pytest again on what is left.

Watchdog: with --tt-test-timeout S, a test that runs longer than S seconds
makes the process write every thread's stack to --tt-stacks (run.sh: the
run's log; not stderr, which pytest captures while a test runs) and exit
(faulthandler.dump_traceback_later(exit=True)); the record then shows that
test as started and not finished.
"""

import faulthandler
import json
import os
import sys

try:
    import pytest
    hookimpl = pytest.hookimpl
except ImportError:  # the selection functions stay importable without pytest (selftest.py)
    def hookimpl(**_):
        return lambda f: f


def pytest_addoption(parser):
    g = parser.getgroup("torchtests", "bench/torchtests selection and record")
    g.addoption("--tt-include", default="", help="comma-separated words; a test is selected when its name contains one")
    g.addoption("--tt-exclude", default="", help="comma-separated words; a test whose name contains one is dropped")
    g.addoption("--tt-match-class", action="store_true", help="match on 'Class.name' instead of the name alone")
    g.addoption("--tt-record", default="", help="JSON-lines record of the run (appended)")
    g.addoption("--tt-test-timeout", type=float, default=0.0, help="seconds a test may run before the process exits")
    g.addoption("--tt-stacks", default="", help="file the watchdog appends the stacks to (default: the record's path + .stacks)")


def item_key(item):
    cls = item.cls.__name__ if getattr(item, "cls", None) is not None else ""
    return f"{cls}::{item.name}"


def words(s):
    return [w.strip().lower() for w in s.split(",") if w.strip()]


def name_selected(cls, name, include, exclude, match_class=False):
    """Whether a test named name in class cls is selected by the word lists."""
    s = (f"{cls}.{name}" if match_class else name).lower()
    if include and not any(w in s for w in include):
        return False
    return not any(w in s for w in exclude)


def read_record(path):
    events = []
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        pass  # a line cut short by a crash
    return events


class Recorder:
    def __init__(self, path):
        self.path = path
        self.f = open(path, "a") if path else None
        prior = read_record(path)
        self.attempt = 1 + sum(1 for e in prior if e.get("event") == "process_end")
        self.prior = prior

    def write(self, **event):
        if self.f is None:
            return
        self.f.write(json.dumps(event, sort_keys=True) + "\n")
        self.f.flush()


def _first_line(report):
    text = ""
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple) and len(lr) == 3:  # skip: (path, lineno, reason)
        text = str(lr[2])
    else:
        crash = getattr(getattr(lr, "reprcrash", None), "message", None)
        text = crash if crash else str(lr)
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


class TorchTestsPlugin:
    def __init__(self, config):
        self.config = config
        self.include = words(config.getoption("tt_include"))
        self.exclude = words(config.getoption("tt_exclude"))
        self.match_class = config.getoption("tt_match_class")
        self.timeout = config.getoption("tt_test_timeout")
        self.rec = Recorder(config.getoption("tt_record"))
        # The watchdog writes to a file of its own: fd 2 is pytest's capture
        # while a test runs, and that is lost when the process exits.
        self.stacks = None
        if self.timeout > 0:
            path = config.getoption("tt_stacks") or (config.getoption("tt_record") + ".stacks"
                                                     if config.getoption("tt_record") else "")
            self.stacks = open(path, "a") if path else sys.__stderr__

    @hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        keep, drop = [], []
        for item in items:
            cls = item.cls.__name__ if getattr(item, "cls", None) is not None else ""
            if name_selected(cls, item.name, self.include, self.exclude, self.match_class):
                keep.append(item)
            else:
                drop.append(item)
        if self.rec.attempt == 1:
            self.rec.write(event="selected", attempt=1, keys=[item_key(i) for i in keep])
        else:
            finished = {e["key"] for e in self.rec.prior if e.get("event") in ("finish", "crashed")}
            started = [e["key"] for e in self.rec.prior if e.get("event") == "start"]
            rcs = [e.get("rc") for e in self.rec.prior if e.get("event") == "process_end"]
            for key in started:
                if key not in finished:
                    self.rec.write(event="crashed", key=key, rc=rcs[-1] if rcs else None,
                                   attempt=self.rec.attempt - 1)
                    finished.add(key)
            left = []
            for item in keep:
                (drop if item_key(item) in finished else left).append(item)
            keep = left
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

    @hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        key = item_key(item)
        self.rec.write(event="start", key=key, nodeid=item.nodeid, attempt=self.rec.attempt)
        if self.timeout > 0:
            faulthandler.dump_traceback_later(self.timeout, exit=True, file=self.stacks)
        try:
            yield
        finally:
            if self.timeout > 0:
                faulthandler.cancel_dump_traceback_later()
            self.rec.write(event="finish", key=key)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            parts = report.nodeid.split("::")
            key = "::".join(parts[1:3]) if len(parts) >= 3 else "::" + parts[-1]
            self.rec.write(event="report", key=key, when=report.when, outcome=report.outcome,
                           xfail=bool(getattr(report, "wasxfail", "")), message=_first_line(report))

    def pytest_sessionfinish(self, session, exitstatus):
        self.rec.write(event="session_finish", attempt=self.rec.attempt, exitstatus=int(exitstatus))


def pytest_configure(config):
    import compat  # bench/torchtests, on PYTHONPATH
    compat.apply()
    config.pluginmanager.register(TorchTestsPlugin(config), "torchtests-plugin")
