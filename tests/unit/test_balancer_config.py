"""The balancer's nginx configuration, and what it says when nginx or an upstream is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.server.balancer import KEEPALIVE, NGINX_ENV, find_nginx, nginx_config
from inflight.tool_errors import ServerError


def test_the_configuration_balances_over_every_upstream_with_keepalive_and_keeps_its_files_in_workdir(
    tmp_path: Path,
) -> None:
    conf = nginx_config(["127.0.0.1:8000", "127.0.0.1:8010"], 9000, tmp_path, workers=2)
    assert "server 127.0.0.1:8000;" in conf and "server 127.0.0.1:8010;" in conf
    assert f"keepalive {KEEPALIVE};" in conf and "proxy_http_version 1.1;" in conf
    assert "listen 127.0.0.1:9000" in conf and "worker_processes 2;" in conf
    assert "client_max_body_size 0;" in conf and "access_log off;" in conf
    paths = [line.split()[1].rstrip(";") for line in conf.splitlines() if "_path " in line or line.startswith("pid ")]
    assert paths and all(p.startswith(str(tmp_path)) for p in paths)


@pytest.mark.parametrize("upstreams", [[], ["localhost"], ["127.0.0.1:http"], [":8000"]])
def test_a_bad_upstream_list_says_what_to_give(upstreams: list[str], tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"upstream|host:port"):
        nginx_config(upstreams, 9000, tmp_path)


def test_a_named_nginx_that_is_not_executable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NGINX_ENV, str(tmp_path / "no-nginx"))
    with pytest.raises(ServerError, match="not an executable file"):
        find_nginx()
