#!/usr/bin/env bash
# Runs every test of the module, installing first what the tests need when
# it is missing: PostgreSQL 15 server binaries, MariaDB, RabbitMQ, Redis, Chromium and
# systemd (for systemd-analyze) from Debian's packages, promtool (taken out
# of Debian's prometheus package into bin/), and dynalite and kinesalite (npm,
# pinned in package-lock.json).
# Usage: scripts/test.sh [extra `go test` arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_update() {
  if [ -z "$apt_updated" ]; then
    echo "test.sh: apt-get update" >&2
    as_root apt-get update -qq
    apt_updated=1
  fi
}
apt_install() {
  apt_update
  echo "test.sh: installing $*" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
  apt_install postgresql-15
fi
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  apt_install rabbitmq-server
fi
# store/mysql and inbox/mysql: MariaDB from the system's binaries
# (internal/servers/mariadb.go).
if [ ! -x /usr/sbin/mariadbd ] || [ ! -x /usr/bin/mariadb-install-db ]; then
  apt_install mariadb-server
fi
# internal/bench: `outbox bench` runs nats-server as its broker process.
if ! command -v nats-server >/dev/null 2>&1; then
  apt_install nats-server
fi
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server # broker/redis and the e2e tests start their own
fi
# promtool alone, extracted from Debian's prometheus package: installing the
# package would also start a Prometheus server.
if ! command -v promtool >/dev/null 2>&1 && [ ! -x bin/promtool ]; then
  apt_update
  echo "test.sh: extracting promtool from Debian's prometheus package into bin/" >&2
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb root)
  mkdir -p bin
  cp "$tmp/root/usr/bin/promtool" bin/promtool
  rm -rf "$tmp"
fi
export PATH="$PWD/bin:$PATH"
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium # the console's browser tests drive it headless
fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
  apt_install systemd # deploy/: systemd-analyze verify on the unit
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
if [ -f package-lock.json ] && [ ! -f node_modules/dynalite/cli.js ]; then
  echo "test.sh: npm ci (dynalite)" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi
# broker/kinesis and the e2e tests: kinesalite (npm, pinned in
# package-lock.json with dynalite; its LevelDB binding ships prebuilt).
if [ -f package-lock.json ] && [ ! -f node_modules/kinesalite/index.js ]; then
  echo "test.sh: npm ci (kinesalite)" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi

go vet ./...
# examples/ is a module of its own (the ORMs' dependencies stay out of the
# outbox's module): vet and test it too, after the outbox's tests.
(cd examples && go vet ./...)
status=0
go test -race -timeout 25m "$@" ./... || status=$?
(cd examples && go test -race -timeout 10m "$@" ./...) || status=$?
exit "$status"
