"""The ledger's request hook: per-user salts the gateway issues are remembered so their blocks can be attributed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.proxy.features import Call, Finish, RequestFeature

UserSaltSink = Callable[[str, int, str], None]


class UserSaltFeature(RequestFeature):
    name = "ledger-user-salts"

    def __init__(self, remember_user_salt: UserSaltSink) -> None:
        self.remember_user_salt = remember_user_salt

    def start(self, call: Call, request: dict[str, Any]) -> Finish | None:
        tenant, user = call.tenant, call.user
        if tenant.cache.isolation == "user" and user is not None:
            # The ledger can only attribute per-user salts it was told about.
            self.remember_user_salt(tenant.tenant, tenant.cache.salt_epoch, user)
        return None
