"""Stand-in for the `expecttest` package (PyPI "expecttest"), for running
PyTorch's test/test_cuda.py on a machine that lacks it.

torch.testing._internal.common_utils does `import expecttest`, subclasses
`expecttest.TestCase` for every PyTorch test case, and reads and sets
`expecttest.ACCEPT` (from its --accept flag). test_cuda.py itself calls no
expect-test method; this module only has to let common_utils import and
behave like the real package where a test does call one.

What it mirrors from the real expecttest (pytorch/expecttest,
expecttest/__init__.py):
- ACCEPT, read from EXPECTTEST_ACCEPT;
- TestCase(unittest.TestCase) with longMessage = True;
- assertExpectedInline(actual, expect, skip=0): applies the substitutions
  registered with substituteExpected, drops a trailing C++ stack trace
  ("\\nException raised from ..."), then requires actual == expect exactly,
  as the real one does (it neither dedents nor strips; the expected literal
  is written with a backslash after its opening quotes instead);
- assertExpectedRaisesInline, assertMultiLineEqualMaybeCppStack,
  substituteExpected.

What it does not do: rewrite the test's source when ACCEPT is set. Where the
real package would accept new output, this one fails, saying so: it never
lets a mismatch pass.
"""

import os
import re
import unittest

__all__ = ["ACCEPT", "TestCase"]

ACCEPT = os.getenv("EXPECTTEST_ACCEPT")

STAND_IN = True  # lets a run tell this stand-in from the real package

_CPP_STACK_HEADER = "\nException raised from"


def _replace_many(rep, text):
    pattern = re.compile("|".join(re.escape(k) for k in rep))
    return pattern.sub(lambda m: rep[m.group(0)], text)


class TestCase(unittest.TestCase):
    longMessage = True

    def substituteExpected(self, pattern, replacement):
        if not hasattr(self, "_expect_filters"):
            self._expect_filters = {}

            def cleanup():
                del self._expect_filters
            self.addCleanup(cleanup)
        if pattern in self._expect_filters:
            raise RuntimeError(
                f"Cannot remap {pattern} to {replacement} "
                f"(existing mapping is {self._expect_filters[pattern]})")
        self._expect_filters[pattern] = replacement

    def assertExpectedInline(self, actual, expect, skip=0):
        if getattr(self, "_expect_filters", None):
            actual = _replace_many(self._expect_filters, actual)
        if ACCEPT and actual != expect:
            self.fail("expecttest stand-in (bench/torchtests/stubs): output differs from the "
                      "inline expectation and this stand-in cannot rewrite the source "
                      "(EXPECTTEST_ACCEPT is set); install the real expecttest to accept.\n"
                      f"expected: {expect!r}\nactual:   {actual!r}")
        self.assertMultiLineEqualMaybeCppStack(
            expect, actual,
            msg="expecttest stand-in: actual output differs from the inline expectation")

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect, skip=1)
            return
        self.fail(msg="Did not raise when expected to")

    def assertMultiLineEqualMaybeCppStack(self, expect, actual, *args, **kwargs):
        if _CPP_STACK_HEADER in actual:
            actual = actual.rsplit(_CPP_STACK_HEADER, maxsplit=1)[0]
        self.assertMultiLineEqual(expect, actual, *args, **kwargs)
