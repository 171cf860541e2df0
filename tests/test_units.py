import doctest

import pytest

import simulator.units as units
from simulator.errors import SpecError
from simulator.units import parse_bandwidth, parse_bytes, parse_time


def test_doctests():
    assert doctest.testmod(units).failed == 0


@pytest.mark.parametrize("text,expected", [
    ("200 Gb/s", 25e9), ("200Gbps", 25e9), ("600 GB/s", 600e9), ("1 GiB/s", 2**30), (5e9, 5e9)])
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("1GiB", 2**30), ("64 MB", 64e6), ("8 Gb", 1e9),
                                           (4096, 4096)])
def test_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_time():
    assert parse_time("30 ns") == pytest.approx(30e-9)
    assert parse_time("1.5ms") == pytest.approx(1.5e-3)


@pytest.mark.parametrize("bad", ["-1 GB/s", "fast", "10 parsecs", True, 0, float("nan")])
def test_bad_bandwidth_names_the_fix(bad):
    with pytest.raises(SpecError) as e:
        parse_bandwidth(bad, field="links[0].bandwidth")
    assert "links[0].bandwidth" in str(e.value) and "fix:" in str(e.value)
