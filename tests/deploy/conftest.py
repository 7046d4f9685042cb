"""Fixtures for the deployment checks: the validators' own virtual environment, created once per machine."""

from __future__ import annotations

import pytest

from tests.deploy.tools import DeployTools, ensure_tools


@pytest.fixture(scope="session")
def deploy_tools() -> DeployTools:
    return ensure_tools()
