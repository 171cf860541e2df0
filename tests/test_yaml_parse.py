"""parse_yaml builds exactly what ``yaml.safe_load`` builds, by its direct walk or by PyYAML's
constructor where the walk steps aside, and leaves the garbage collector as it found it."""

import gc
import math
from importlib.resources import files

import pytest
import yaml

from simulator.errors import SpecError
from simulator.fileio import parse_yaml

DOCUMENTS = [
    "a: 1\nb: [1, 2.5, .inf, ~, true, 'x', 0x1f, 1_000, 2001-12-14, 0o17]\n",
    "<<: {a: 1}\nb: 2\n",                        # merge key: the constructor's path
    "!!set {a, b}\n",                             # another tag
    "a: !!str 1\nb: !!float 3\n",
    "x: !!binary aGVsbG8=\n",
    "{1: a, 2.0: b, null: c, false: d}\n",
    "- - - x\n  - {}\n- []\n",
    "a: 1\na: 2\n",                               # the last of a repeated key wins in both
    "=: 3\n",
    "a: &x [1, 2]\nb: *x\n",                      # anchors: the constructor's path
    "a: .nan\n",
    "",
    "just a string\n",
]


def _same(a, b) -> bool:
    """Equal values of the same types all the way down (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("text", DOCUMENTS)
def test_parse_yaml_builds_what_safe_load_builds(text):
    assert _same(parse_yaml(text, source="doc.yaml"), yaml.safe_load(text))


def test_every_built_in_topology_parses_as_safe_load_parses_it():
    shipped = [p for p in files("topologies").iterdir() if p.name.endswith(".yaml")]
    assert len(shipped) >= 5
    for path in shipped:
        text = path.read_text()
        assert _same(parse_yaml(text, source=path.name), yaml.safe_load(text)), path.name


def test_a_sequence_as_a_key_is_still_refused_with_the_file_named():
    with pytest.raises(SpecError) as err:
        parse_yaml("? [a]\n: 1\n", source="keys.yaml")
    assert "keys.yaml" in str(err.value)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was_found(enabled):
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        parse_yaml("a: [1, 2]\n", source="ok.yaml")
        assert gc.isenabled() is enabled
        with pytest.raises(SpecError):
            parse_yaml("a: [1, 2\n", source="broken.yaml")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
