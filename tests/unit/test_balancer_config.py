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


def test_balancer_config_prints_what_nginx_accepts_listening_where_asked(tmp_path: Path) -> None:
    import subprocess

    from typer.testing import CliRunner

    from inflight.cli import app

    work = tmp_path / "nginx"
    args = ["balancer-config", "10.0.0.1:8000", "10.0.0.2:8000", "--listen", "0.0.0.0:18080", "--workers", "2"]
    res = CliRunner().invoke(app, [*args, "--workdir", str(work)])
    assert res.exit_code == 0, res.output
    assert "listen 0.0.0.0:18080" in res.output and "server 10.0.0.2:8000;" in res.output
    assert work.is_dir()
    try:
        nginx = find_nginx()
    except ServerError as e:
        pytest.skip(f"nginx -t needs nginx (scripts/setup.sh unpacks it into .venv/nginx): {e}")
    conf = tmp_path / "nginx.conf"
    conf.write_text(res.output)
    checked = subprocess.run([str(nginx), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    bad = CliRunner().invoke(app, ["balancer-config", "10.0.0.1", "--workdir", str(work)])
    assert bad.exit_code == 2 and "host:port" in bad.output
    bad = CliRunner().invoke(app, ["balancer-config", "10.0.0.1:8000", "--listen", "8080", "--workdir", str(work)])
    assert bad.exit_code == 2 and "--listen" in bad.output
