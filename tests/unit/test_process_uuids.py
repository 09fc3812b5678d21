"""GPU UUID spellings and old-to-new mappings, checked before anything reaches the driver."""

from __future__ import annotations

import pytest

from ferry.errors import ConfigError
from ferry.process.uuids import (
    GpuUuid,
    complete_mapping,
    format_mapping,
    normalize_mapping,
    parse_mapping_items,
)

A = "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6"
B = "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
C = "GPU-5449fdd5-fb83-f4ed-37a3-ea1057d82160"


@pytest.mark.parametrize(
    "text",
    [A, A.lower(), A.upper(), A[4:], A[4:].replace("-", ""), f"  {A}  ", "gpu-" + A[4:]],
)
def test_every_spelling_is_the_same_16_bytes(text: str) -> None:
    u = GpuUuid.parse(text)
    assert u.raw == bytes.fromhex("eea0d83febcdac276b3ebec2a19724e6")
    assert str(u) == A
    assert u.hex == A[4:]
    assert GpuUuid.parse(u) is u


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is not a GPU UUID"),
        ("GPU-1234", "is not a GPU UUID"),
        ("GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e", "is not a GPU UUID"),  # 31 digits
        ("GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724zz", "is not a GPU UUID"),
        ("eea0d83f-ebcdac27-6b3e-bec2a19724e6", "is not a GPU UUID"),  # hyphens misplaced
        ("0", "is not a GPU UUID"),  # an index is not a UUID
        ("MIG-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6", "is a MIG instance"),
    ],
)
def test_bad_uuids_are_refused_with_the_expected_form(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        GpuUuid.parse(text)
    assert "nvidia-smi -L" in str(err.value)


def test_non_string_and_wrong_length_bytes_are_refused() -> None:
    with pytest.raises(ConfigError, match="a GPU UUID is a string"):
        GpuUuid.parse(1234)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="16 bytes"):
        GpuUuid(b"\x00" * 15)


def test_map_options_repeat_or_comma_separate() -> None:
    m = parse_mapping_items([f"{A}={B}", f"{B[4:]}={A} , ", ""])
    assert m == {GpuUuid.parse(A): GpuUuid.parse(B), GpuUuid.parse(B): GpuUuid.parse(A)}
    assert parse_mapping_items([f"{A}={B},{B}={A}"]) == m
    assert format_mapping(m) == f"{A}={B},{B}={A}"


@pytest.mark.parametrize("item", [A, f"{A}=", f"={B}", f"{A}:{B}"])
def test_map_option_without_old_equals_new_is_refused(item: str) -> None:
    with pytest.raises(ConfigError, match="expected OLD=NEW"):
        parse_mapping_items([item])


def test_one_gpu_mapped_twice_or_two_onto_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="mapped twice"):
        parse_mapping_items([f"{A}={B}", f"{A}={C}"])
    assert parse_mapping_items([f"{A}={B}", f"{A}={B}"]) == {GpuUuid.parse(A): GpuUuid.parse(B)}
    with pytest.raises(ConfigError, match="are both mapped to"):
        normalize_mapping({A: C, B: C})


def test_mapping_must_cover_exactly_the_gpus_used() -> None:
    a, b, c = (GpuUuid.parse(x) for x in (A, B, C))
    assert complete_mapping({b: c, a: a}, [a, b]) == {a: a, b: c}
    with pytest.raises(ConfigError, match=f"must cover every GPU the process used; missing {B}"):
        complete_mapping({a: c}, [a, b])
    with pytest.raises(ConfigError, match=f"names {C}, which the process did not use"):
        complete_mapping({a: b, c: a}, [a])
    with pytest.raises(ConfigError, match="does not know which GPUs the process used"):
        complete_mapping({a: b}, [])


def test_gpus_the_process_only_opened_are_placed_too() -> None:
    a, b, c, d = (GpuUuid.parse(x) for x in (A, B, C, "GPU-6fbeda44-9d0c-67a9-1dd4-44a22fb5ff2c"))
    # moving onto a GPU the process also had open: that one takes the freed place (a swap)
    assert complete_mapping({a: b}, [a], [b, c]) == {b: a, a: b, c: c}
    # moving elsewhere (another host): the opened ones stay
    assert complete_mapping({a: d}, [a], [b]) == {b: b, a: d}
    # they may be named explicitly, but a GPU neither used nor opened may not
    assert complete_mapping({a: b, b: c}, [a], [b, c]) == {b: c, a: b, c: a}
    with pytest.raises(ConfigError, match=f"names {D_TEXT}"):
        complete_mapping({a: b, d: a}, [a], [b])


D_TEXT = "GPU-6fbeda44-9d0c-67a9-1dd4-44a22fb5ff2c"
