"""The ledger's string vocabularies: the stored values of the close reasons and source-event kinds never change
(they are in every existing ledger and in the audit's JSON), and the media the code names are the policy's."""

from __future__ import annotations

from typing import get_args

from gateway.kvevents.formats.lmcache import MEDIUM_GROUPS, lmcache_medium
from gateway.kvevents.media import KNOWN_MEDIA
from gateway.kvevents.wire import normalize_medium
from gateway.ledger.records import CLOSING_REASONS, SOURCE_EVENT_KINDS, CloseReason, SourceEventKind
from gateway.policy.model import Medium


def test_close_reasons_keep_their_stored_values() -> None:
    assert [reason.value for reason in CloseReason] == [
        "removed", "cleared", "restart", "restart_presumed", "reset", "lost"]
    assert {str(reason) for reason in CLOSING_REASONS} == {"removed", "cleared", "restart", "reset"}


def test_source_event_kinds_keep_their_stored_values_and_cover_every_source_wide_close() -> None:
    assert [kind.value for kind in SourceEventKind] == [
        "restart", "restart_presumed", "reset", "lost", "silent", "resumed"]
    assert [SourceEventKind(reason) for reason in SOURCE_EVENT_KINDS] == [
        SourceEventKind.RESTART, SourceEventKind.RESTART_PRESUMED, SourceEventKind.RESET, SourceEventKind.LOST]


def test_the_named_media_are_the_policy_vocabulary() -> None:
    assert set(KNOWN_MEDIA) == set(get_args(Medium))
    assert set(MEDIUM_GROUPS) <= set(KNOWN_MEDIA)


def test_media_stay_open_an_unforeseen_name_is_kept_not_renamed() -> None:
    assert normalize_medium("nvme_tier") == "NVME_TIER"
    assert lmcache_medium("SomeNewBackend") == "SOMENEWBACKEND"
    assert normalize_medium(None) == "GPU"
