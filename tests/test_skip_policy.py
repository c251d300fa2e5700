"""The suite fails when a test skips for a reason that tests/conftest.py does not allow."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def test_an_unlisted_skip_fails_the_session(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_sample="import pytest\n\ndef test_gone():\n    pytest.skip('service missing')\n"
        "\ndef test_ok():\n    pass\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ALLOWED_SKIPS*", "*test_gone: Skipped: service missing*"])


def test_a_run_without_skips_passes(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_sample="def test_ok():\n    pass\n")
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret == pytest.ExitCode.OK
