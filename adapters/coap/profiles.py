"""The ready-made CoAP resources: `/s/{sensor}/{property}` for a value, `/s/{device}` for a SenML pack.

They mirror the MQTT adapter's generic and SenML profiles, under the `coap/` part of the gateway's
IRIs: `urn:sepa-gateway:sensor:coap/<sensor>`, `urn:sepa-gateway:feature:coap/<sensor>`, and for a
pack `urn:sepa-gateway:sensor:coap/<device>/<record name>`. `<property>` is a known property name
(temperature, humidity...; adapters/mqtt/profiles.py lists them) in its default unit. Mappings of
the config file and of the mappings graph come first, so a deployment may claim any path.
"""

from __future__ import annotations

from gateway.observations import Mapping
from gateway.observations.vocabulary import URN

SENSOR = URN + "sensor:coap/"
FEATURE = URN + "feature:coap/"
PROFILE_ORDER = 2000  # after the MQTT profiles' 1000+: a path both could take is the config's to claim


def default_profiles() -> list[Mapping]:
    return [
        Mapping(
            "coap-senml",
            "s/{device}",
            "senml",
            sensor=SENSOR + "{device}/{name}",
            feature=FEATURE + "{device}",
            order=PROFILE_ORDER,
        ),
        Mapping(
            "coap-generic",
            "s/{sensor}/{property}",
            "number",
            sensor=SENSOR + "{sensor}",
            feature=FEATURE + "{sensor}",
            property="{property}",
            order=PROFILE_ORDER + 1,
        ),
    ]
