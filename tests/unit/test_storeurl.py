"""Registry URLs (sidecar.common.storeurl): what is accepted, what is refused and how it is said,
where the password comes from, and how a URL decides between a store and a directory."""

from __future__ import annotations

import pytest

from sidecar.common import storeurl
from sidecar.common.exceptions import ConfigError
from sidecar.common.identity import registry_url
from sidecar.common.storeurl import StoreURL


@pytest.mark.parametrize(("text", "parsed"), [
    ("redis://10.0.0.5:6379/0", StoreURL("redis", "10.0.0.5", 6379, 0)),
    ("redis://cache", StoreURL("redis", "cache", 6379, 0)),
    ("rediss://alice@redis.ml.svc:6380/3", StoreURL("rediss", "redis.ml.svc", 6380, 3, user="alice")),
    ("redis://h:1/2/team-a", StoreURL("redis", "h", 1, 2, prefix="team-a")),
    ("redis://[::1]:7000/0", StoreURL("redis", "::1", 7000, 0)),
])
def test_accepted(text, parsed):
    url = storeurl.parse(text)
    assert url == parsed
    assert storeurl.parse(url.display()) == url  # what logs show parses back to the same registry
    assert url.tls == (url.scheme == "rediss")


@pytest.mark.parametrize(("text", "why"), [
    ("redis://h:6379/x", "the database 'x' is not a number"),
    ("redis://h:notaport/0", "Port could not be cast"),
    ("memcached://h:1/0", "the scheme 'memcached' is not one of redis, rediss"),
    ("redis://:6379/0", "no host"),
    ("redis://h:1/0/a/b", "the path is /db or /db/prefix"),
    ("redis://h:1/0/bad prefix!", "the prefix 'bad prefix!'"),
    ("redis://h:1/0?ssl=1", "a query or fragment is not understood"),
])
def test_refused_with_the_reason(text, why):
    with pytest.raises(ConfigError) as err:
        storeurl.parse(text, "COSMOS_PROFILER_DIR")
    message = str(err.value)
    assert message.startswith("COSMOS_PROFILER_DIR ") and why in message and "\n" not in message, message
    assert "expected redis://[user@]host:port/db" in message


def test_a_password_in_the_url_is_refused_and_never_repeated():
    with pytest.raises(ConfigError) as err:
        storeurl.parse("redis://alice:hunter2@h:6379/0")
    message = str(err.value)
    assert "hunter2" not in message and "alice:***@" in message
    assert storeurl.ENV_PASSWORD in message and storeurl.ENV_PASSWORD_FILE in message


def test_password_from_the_variable_then_the_file(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\nsecond line ignored\n")
    assert storeurl.password({}) is None
    assert storeurl.password({storeurl.ENV_PASSWORD_FILE: str(secret)}) == "from-file"
    assert storeurl.password({storeurl.ENV_PASSWORD: "from-env", storeurl.ENV_PASSWORD_FILE: str(secret)}) == "from-env"
    with pytest.raises(ConfigError) as err:
        storeurl.password({storeurl.ENV_PASSWORD_FILE: str(tmp_path / "missing")})
    assert str(err.value).startswith(f"{storeurl.ENV_PASSWORD_FILE}={tmp_path / 'missing'} cannot be read")


def test_a_url_is_a_store_whatever_names_it_and_a_path_is_not():
    env = {"COSMOS_PROFILER_DIR": "redis://h:1/0"}
    assert registry_url(None, env) == "redis://h:1/0"
    assert registry_url("/shared/reg", env) is None  # the argument first, as for paths
    assert registry_url(None, {}, configured="rediss://h:2/1") == "rediss://h:2/1"
    assert registry_url(None, {}, configured="/shared/reg") is None


def test_each_registry_has_its_own_mirror(tmp_path):
    a, b = storeurl.parse("redis://h:1/0"), storeurl.parse("redis://h:1/0/other")
    assert storeurl.mirror_dir(tmp_path, a) != storeurl.mirror_dir(tmp_path, b)
    assert storeurl.mirror_dir(tmp_path, a) == storeurl.mirror_dir(tmp_path, storeurl.parse("redis://h:1"))


def test_a_cosmos_rl_jobs_redis():
    from types import SimpleNamespace

    from sidecar.cosmos.profiler import job_redis
    from sidecar.fleet.controller import meta_redis_port

    assert meta_redis_port({"config": {"redis": "12808"}}) == 12808
    assert [meta_redis_port(m) for m in ({"config": {"redis": ""}}, {"config": {}}, {}, {"config": {"redis": "x"}},
                                         {"config": {"redis": "70000"}}, {"config": {"redis": True}})] == [None] * 6
    config, client = SimpleNamespace(redis="12808"), SimpleNamespace(remote_ips=["10.0.0.5", "10.0.0.6"])
    assert job_redis(config, client, env={}) == "redis://10.0.0.5:12808/0"
    assert job_redis(config, None, env={"COSMOS_CONTROLLER_HOST": "10.0.0.9;10.0.0.8:8000"}) == "redis://10.0.0.9:12808/0"
    # a registry configured anywhere wins; no port or no host: no Redis
    assert job_redis(config, client, env={"COSMOS_PROFILER_DIR": "/shared/reg"}) is None
    assert job_redis(config, client, configured="/shared/reg", env={}) is None
    assert job_redis(SimpleNamespace(redis=""), client, env={}) is None
    assert job_redis(config, None, env={}) is None
