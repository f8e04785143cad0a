"""What a client reads of an engine's failure names the engine, never its address: every
form the engine layer writes it in (URL, host:port, the host alone), for the engines of
the running configuration and for those a reload removed."""

from __future__ import annotations

from narwhal.api.redaction import EngineRedaction
from narwhal.config import EngineConfig


def engines(*pairs: tuple[str, str]) -> list[EngineConfig]:
    return [EngineConfig(name=name, url=url) for name, url in pairs]


def test_every_form_of_an_address_becomes_the_engine_name() -> None:
    redaction = EngineRedaction().for_engines(
        engines(("h0", "http://10.0.0.5:8001/"), ("h1", "https://gpu-7.internal"))
    )
    redact = redaction.redact
    assert (
        redact("engine h0 stream broke: 10.0.0.5:8001 closed the connection mid-body")
        == "engine h0 stream broke: <h0> closed the connection mid-body"
    )
    assert redact("cannot connect to http://10.0.0.5:8001/v1/completions") == (
        "cannot connect to <h0>/v1/completions"
    )
    assert redact("gpu-7.internal:443 reset the connection") == "<h1> reset the connection"
    assert redact("https://gpu-7.internal timed out") == "<h1> timed out"
    assert redact("no route to host 10.0.0.5") == "no route to host <engine host>"
    assert redact("engine h0 sent nothing for 2 s") == "engine h0 sent nothing for 2 s"


def test_an_engine_a_reload_removed_stays_redacted_and_a_new_name_wins() -> None:
    first = EngineRedaction().for_engines(engines(("h0", "http://127.0.0.1:9000")))
    reloaded = first.for_engines(engines(("h2", "http://127.0.0.1:9001")))
    assert reloaded.redact("127.0.0.1:9000 closed") == "<h0> closed"  # a request in flight
    assert reloaded.redact("127.0.0.1:9001 closed") == "<h2> closed"
    moved = reloaded.for_engines(engines(("h5", "http://127.0.0.1:9000")))
    assert moved.redact("127.0.0.1:9000 closed") == "<h5> closed"
