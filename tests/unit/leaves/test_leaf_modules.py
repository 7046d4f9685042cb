"""The leaf modules called directly: key hashes and the policy line (known answers from `openssl dgst`), salts of
unusual inputs (known answers from `openssl dgst -hmac`), ISO times, report tables, outcome names, and settings
validation including the salt-secret rules."""

from __future__ import annotations

import os
import re
import string
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.isotime import parse_since
from gateway.keys import KEY_PREFIX, hash_key, hash_key_bytes, new_key, policy_line
from gateway.outcomes import Outcome, ShadowOutcome
from gateway.salts import derive_salt
from gateway.settings import MIN_SALT_SECRET_BYTES, SaltSecretError, Settings, salt_secret_bytes
from gateway.tables import cell, ms, table

# --- keys ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "digest"), [
    # printf '%s' KEY | openssl dgst -sha256
    ("kvg_example-key", "863965764afa54e81d75c6ce2fdaff9229decc586096636dc34a90057a4c260c"),
    ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("ключ-✓", "c1e0bfb768a5a63f791eb43be036870dde9ca5821241bd71d10f7032170d0490"),  # UTF-8 bytes are hashed
])
def test_a_key_hash_is_the_sha256_hex_of_its_utf8_bytes(key: str, digest: str) -> None:
    assert hash_key(key) == digest
    assert hash_key_bytes(key.encode()) == digest


def test_header_bytes_that_are_not_utf8_still_hash() -> None:
    assert hash_key_bytes(b"\xff\xfe") == "b3d510ef04275ca8e698e5b3cbb0ece3949ef9252f0cdc839e9ee347409a2209"


def test_new_keys_carry_the_prefix_and_256_random_bits_in_url_safe_text() -> None:
    keys = {new_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert key.startswith(KEY_PREFIX) and KEY_PREFIX == "kvg_"
        body = key[len(KEY_PREFIX):]
        assert len(body) == 43  # 32 bytes in unpadded base64
        assert set(body) <= set(string.ascii_letters + string.digits + "-_")


def test_the_policy_line_is_yaml_that_a_tenant_file_accepts() -> None:
    line = policy_line("kvg_example-key")
    assert line == ('  - sha256: "863965764afa54e81d75c6ce2fdaff9229decc586096636dc34a90057a4c260c"\n'
                    "    scopes: [inference]")
    assert yaml.safe_load("keys:\n" + line) == {"keys": [
        {"sha256": "863965764afa54e81d75c6ce2fdaff9229decc586096636dc34a90057a4c260c", "scopes": ["inference"]}]}
    assert "kvg_example-key" not in line  # the key itself never goes into a policy


# --- salts ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tenant", "epoch", "user", "salt"), [
    # printf '%s' 'MESSAGE' | openssl dgst -sha256 -hmac 'unit-secret'
    ("acme", 0, None, "be973566aa9147342602a61b56d4824ba430074d2ba733a0618d50d3eb7138e6"),
    ("acme", -1, None, "66e7b789577e9346c02e64fe64267e99a7deb71b1e2047572c2cb0cc7555b4c0"),
    ("ünï", 1_000_000, "用户", "ef38b13bca1b51a2ffd828851333002b9756465b5f78e88d1146b1009aa61f9d"),
])
def test_salts_of_unusual_inputs_match_openssl(tenant: str, epoch: int, user: str | None, salt: str) -> None:
    assert derive_salt(b"unit-secret", tenant, epoch, user) == salt


@settings(max_examples=60, deadline=None)
@given(secret=st.binary(min_size=1, max_size=64), tenant=st.text(max_size=20), epoch=st.integers(0, 10**6),
       user=st.one_of(st.none(), st.text(max_size=20)))
def test_every_salt_is_within_vllms_limits(secret: bytes, tenant: str, epoch: int, user: str | None) -> None:
    salt = derive_salt(secret, tenant, epoch, user)
    assert re.fullmatch(r"[0-9a-f]{64}", salt)  # <= 128 characters, none of @ / \ or NUL


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=10), st.text(max_size=10))
def test_different_users_of_one_tenant_get_different_salts(one: str, other: str) -> None:
    if one != other:
        assert derive_salt(b"s" * 32, "acme", 1, one) != derive_salt(b"s" * 32, "acme", 1, other)


# --- ISO times -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "moment"), [
    ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
    ("2026-12-01T10:30", datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
    ("2026-12-01T10:30:00Z", datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
    ("2026-12-01 10:30:00", datetime(2026, 12, 1, 10, 30, tzinfo=UTC)),
    ("2026-12-01T10:30:00.250", datetime(2026, 12, 1, 10, 30, 0, 250_000, tzinfo=UTC)),
    ("2026-12-01T10:30:00+02:00", datetime(2026, 12, 1, 10, 30, tzinfo=timezone(timedelta(hours=2)))),
    ("2026-12-01T10:30:00-05:30", datetime(2026, 12, 1, 16, 0, tzinfo=UTC)),
])
def test_iso_times_without_a_zone_are_utc(text: str, moment: datetime) -> None:
    parsed = parse_since(text)
    assert parsed == moment and parsed.tzinfo is not None


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01", "2026-12-01T25:00", "1733040000", "12/01/2026"])
def test_a_time_that_is_not_iso_8601_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


# --- tables --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (0, "0"), (0.0, "0.000"), (1.23456, "1.235"), (-2.5, "-2.500"), (True, "True"), ("ünï", "ünï"),
    (10**20, "100000000000000000000"), ([1, 2], "[1, 2]"),
])
def test_cells(value: object, text: str) -> None:
    assert cell(value) == text


@pytest.mark.parametrize(("seconds", "milliseconds"), [(None, None), (0.0, 0.0), (0.00125, 1.2), (1.5, 1500.0),
                                                       (-0.0456, -45.6)])
def test_ms_rounds_to_a_tenth_of_a_millisecond(seconds: float | None, milliseconds: float | None) -> None:
    assert ms(seconds) == milliseconds


def test_a_table_pads_every_column_to_its_widest_cell() -> None:
    assert table(["a", "long header"], [[1, None], ["wide value", 2.0]]) == (
        "a           long header\n"
        "----------  -----------\n"
        "1           -          \n"
        "wide value  2.000      ")


def test_a_table_without_rows_is_its_header_and_rule() -> None:
    assert table(["x", "yy"], []) == "x  yy\n-  --"


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError):
        table(["a", "b"], [[1, 2, 3]])


# --- outcome names -------------------------------------------------------------------------------------------------


def test_outcome_label_values_are_the_published_strings() -> None:
    assert [str(outcome) for outcome in Outcome] == ["ok", "client_disconnected", "upstream_failed_mid_stream",
                                                     "refused", "miss_path_exhausted", "internal_error"]
    assert [str(outcome) for outcome in ShadowOutcome] == ["compared", "dropped", "error"]
    assert f"{Outcome.OK}" == "ok" and Outcome("refused") is Outcome.REFUSED


# --- settings ------------------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("KVGATE_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_without_any_variable(clean_env: pytest.MonkeyPatch) -> None:
    defaults = Settings()
    assert (defaults.host, defaults.port, defaults.policies, defaults.redis_url) == ("127.0.0.1", 8080,
                                                                                   Path("policies"), None)
    assert defaults.salt_secret is None and defaults.max_in_flight == 1024 and defaults.reuse_trace is True


def test_variables_are_read_with_the_kvgate_prefix_and_typed(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("KVGATE_PORT", "9090")
    clean_env.setenv("KVGATE_OTEL_METRICS", "true")
    clean_env.setenv("KVGATE_READ_TIMEOUT_S", "2.5")
    clean_env.setenv("KVGATE_POLICIES", "/etc/kvgate")
    clean_env.setenv("PORT", "1")  # not ours
    clean_env.setenv("KVGATE_NOT_A_SETTING", "x")  # ignored, not an error
    loaded = Settings()
    assert (loaded.port, loaded.otel_metrics, loaded.read_timeout_s, loaded.policies) == (9090, True, 2.5,
                                                                                        Path("/etc/kvgate"))


@pytest.mark.parametrize(("field", "value"), [
    ("port", -1), ("port", 65536), ("connect_timeout_s", 0), ("read_timeout_s", -1.0), ("upstream_connections", 0),
    ("max_header_bytes", 1023), ("json_max_depth", 1), ("json_max_depth", 513), ("admission_sketch_width", 0),
    ("admission_sketch_width", 65537), ("reuse_sample_rate", 0), ("reuse_sample_rate", 1.01),
    ("log_format", "text"), ("log_level", "trace"), ("max_in_flight", 0), ("reuse_block_tokens", 0),
])
def test_out_of_range_settings_are_refused_naming_the_field(clean_env: pytest.MonkeyPatch, field: str,
                                                            value: object) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings.model_validate({field: value})
    assert [error["loc"] for error in raised.value.errors()] == [(field,)]


@pytest.mark.parametrize(("field", "value"), [
    ("port", 0), ("port", 65535), ("max_header_bytes", 1024), ("json_max_depth", 2), ("json_max_depth", 512),
    ("admission_sketch_width", 1), ("admission_sketch_width", 65536), ("reuse_sample_rate", 1.0),
])
def test_boundary_settings_are_accepted(clean_env: pytest.MonkeyPatch, field: str, value: object) -> None:
    assert getattr(Settings.model_validate({field: value}), field) == value


def test_the_salt_secret_is_hidden_in_representations(clean_env: pytest.MonkeyPatch) -> None:
    secret = "s" * 40
    loaded = Settings.model_validate({"salt_secret": secret})
    assert secret not in repr(loaded) and secret not in str(loaded.model_dump())
    assert salt_secret_bytes(loaded) == secret.encode()


@pytest.mark.parametrize(("secret", "message"), [
    (None, "KVGATE_SALT_SECRET must be set"),
    ("", "KVGATE_SALT_SECRET must be set"),
    ("x" * 31, "KVGATE_SALT_SECRET is 31 bytes; it must be at least 32"),
    ("é" * 15, "KVGATE_SALT_SECRET is 30 bytes"),  # counted in bytes, not characters
])
def test_a_missing_or_short_salt_secret_is_refused(clean_env: pytest.MonkeyPatch, secret: str | None,
                                                   message: str) -> None:
    with pytest.raises(SaltSecretError, match=message) as raised:
        salt_secret_bytes(Settings.model_validate({"salt_secret": secret}))
    if secret:
        assert secret not in str(raised.value)  # the message never quotes the secret


@pytest.mark.parametrize("secret", ["x" * 32, "é" * 16, "x" * 500])
def test_a_secret_of_32_bytes_or_more_is_accepted(clean_env: pytest.MonkeyPatch, secret: str) -> None:
    assert len(salt_secret_bytes(Settings.model_validate({"salt_secret": secret}))) >= MIN_SALT_SECRET_BYTES
