"""Which paths a CoAP sensor may post to (gateway/appliance/oscore_sensors.py): its own, and its patterns."""

from __future__ import annotations

import pytest

from gateway.appliance.oscore_sensors import CredentialError, allow_paths, allowed_paths, create_sensor, may_post


@pytest.mark.parametrize(
    ("patterns", "path", "allowed"),
    [
        ((), "s/boiler", True),
        ((), "s/boiler/temperature", True),
        ((), "s/boilerX/temperature", False),
        ((), "s/pump/temperature", False),
        ((), "plant/boiler", False),
        (("s/+/temperature",), "s/pump/temperature", True),
        (("s/+/temperature",), "s/pump/humidity", False),
        (("s/+/temperature",), "s/pump/temperature/x", False),
        (("plant/#",), "plant/boiler/t", True),
        (("plant/#",), "plants/boiler", False),
        (("a/b",), "a/b", True),
        (("a/b",), "a", False),
    ],
)
def test_a_sensor_may_post_to_its_own_resources_and_its_patterns(patterns, path, allowed) -> None:
    assert may_post("boiler", patterns, path) is allowed


def test_patterns_are_checked_and_kept_beside_the_context(tmp_path) -> None:
    create_sensor(tmp_path, "boiler")
    assert allowed_paths(tmp_path / "boiler") == ()
    allow_paths(tmp_path, "boiler", ["plant/#", "s/+/t"])
    assert allowed_paths(tmp_path / "boiler") == ("plant/#", "s/+/t")
    for bad in ["/abs", "a/#/b", "a/x+/b", ""]:
        with pytest.raises(CredentialError):
            allow_paths(tmp_path, "boiler", [bad])
    with pytest.raises(CredentialError):
        allow_paths(tmp_path, "nobody", ["a"])
    allow_paths(tmp_path, "boiler", [])
    assert allowed_paths(tmp_path / "boiler") == ()
