#!/usr/bin/python3
"""One ctest entry per pytest test, without running a file's fixtures once
per test.

ctest runs each pytest file once (run_pytest.py --results XML, the file's
entry, a ctest fixture) and then one entry per test function of it, which
reads that test's outcome from the run's JUnit XML: a failure names its
test and prints its message and output, and the file's cluster or SLURM
daemons still start once.

  pytest_cases.py list FILE        the file's test functions, one per line
                                   (read from its source: nothing imported)
  pytest_cases.py check XML TEST   exit 0 if every case of TEST (each of its
                                   parametrizations) passed, 77 if all were
                                   skipped, 1 otherwise, naming the cases
"""
import ast
import sys
import xml.etree.ElementTree as ET

SKIPPED = 77  # ctest's SKIP_RETURN_CODE for these entries


def list_tests(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        member.name.startswith("test"):
                    names.append(f"{node.name}::{member.name}")
    return names


def cases_of(root, test):
    """The <testcase> elements of TEST ("name" or "Class::name"), every
    parametrization ("name[...]") included."""
    cls, _, name = test.rpartition("::")
    found = []
    for case in root.iter("testcase"):
        case_name = case.get("name", "")
        if case_name != name and not case_name.startswith(name + "["):
            continue
        # "tests.python.test_x" for a function, "...test_x.TestY" for a
        # method (the files are test_*.py; classes Test*).
        last = case.get("classname", "").rpartition(".")[2]
        if (last != cls) if cls else last.startswith("Test"):
            continue
        found.append(case)
    return found


def check(xml_path, test):
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{test}: no results from its file's run ({xml_path}: {e}); "
              f"see that file's ctest entry", file=sys.stderr)
        return 1
    cases = cases_of(root, test)
    if not cases:
        print(f"{test}: not in {xml_path}: the file's run did not collect it "
              f"(see that file's ctest entry)", file=sys.stderr)
        return 1
    failed, skipped = [], []
    for case in cases:
        label = case.get("name")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed.append(label)
            print(f"==== {label}: {bad.tag}: {bad.get('message', '')}")
            print(bad.text or "")
            for stream in ("system-out", "system-err"):
                text = case.findtext(stream)
                if text:
                    print(f"---- {label}: captured {stream[7:]}")
                    print(text)
        elif case.find("skipped") is not None:
            skipped.append(label)
            print(f"{label}: skipped: {case.find('skipped').get('message', '')}")
        else:
            print(f"{label}: passed ({case.get('time', '?')} s)")
    if failed:
        print(f"{test}: {len(failed)} of {len(cases)} failed: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    if len(skipped) == len(cases):
        return SKIPPED
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "list":
        print("\n".join(list_tests(argv[2])))
        return 0
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
