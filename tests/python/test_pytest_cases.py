"""How ctest reports pytest tests one by one: a file runs once through
run_pytest.py --results, then pytest_cases.py gives each test function its
own outcome (exit 0 passed, 1 failed, 77 skipped) from the run's XML."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

DEMO = '''
import pytest

def test_passes():
    print("fine")

def test_fails():
    print("output of the failing test")
    assert 1 == 2

@pytest.mark.parametrize("x", [1, 2])
def test_one_parametrization_fails(x):
    assert x == 1

@pytest.mark.skip(reason="not on this machine")
def test_skipped():
    pass

class TestGroup:
    def test_passes(self):
        pass

    def test_fails(self):
        assert False, "in the class"
'''


def run(*args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_each_test_function_gets_its_own_outcome(tmp_path):
    (tmp_path / "test_demo.py").write_text(DEMO)
    results = tmp_path / "out" / "results.xml"
    runner = run(os.path.join(HERE, "run_pytest.py"), "--results", str(results),
                 "-q", "-p", "no:cacheprovider", "test_demo.py", cwd=tmp_path)
    # The run got through every test: its failures are the tests' entries'.
    assert runner.returncode == 0, runner.stdout + runner.stderr
    assert "3 failed, 3 passed, 1 skipped" in runner.stdout

    listed = run(os.path.join(HERE, "pytest_cases.py"), "list", "test_demo.py",
                 cwd=tmp_path)
    assert listed.stdout.split() == [
        "test_passes", "test_fails", "test_one_parametrization_fails", "test_skipped",
        "TestGroup::test_passes", "TestGroup::test_fails"]

    def check(test):
        return run(os.path.join(HERE, "pytest_cases.py"), "check", str(results), test,
                   cwd=tmp_path)

    assert check("test_passes").returncode == 0
    assert check("TestGroup::test_passes").returncode == 0
    failed = check("test_fails")
    assert failed.returncode == 1
    assert "assert 1 == 2" in failed.stdout
    assert "output of the failing test" in failed.stdout
    in_class = check("TestGroup::test_fails")
    assert in_class.returncode == 1 and "in the class" in in_class.stdout
    param = check("test_one_parametrization_fails")
    assert param.returncode == 1
    assert "1 of 2 failed: test_one_parametrization_fails[2]" in param.stderr
    assert check("test_skipped").returncode == 77
    missing = check("test_not_there")
    assert missing.returncode == 1 and "did not collect it" in missing.stderr


def test_a_run_that_cannot_collect_fails_its_file_and_every_test(tmp_path):
    (tmp_path / "test_broken.py").write_text("import not_a_module\n\ndef test_x():\n    pass\n")
    results = tmp_path / "results.xml"
    results.write_text("<stale/>")  # an earlier run's file is never read
    runner = run(os.path.join(HERE, "run_pytest.py"), "--results", str(results),
                 "-q", "-p", "no:cacheprovider", "test_broken.py", cwd=tmp_path)
    assert runner.returncode == 2, runner.stdout + runner.stderr
    check = run(os.path.join(HERE, "pytest_cases.py"), "check", str(results), "test_x",
                cwd=tmp_path)
    assert check.returncode == 1
