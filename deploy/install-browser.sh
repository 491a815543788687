#!/usr/bin/env bash
# Installs what the web inbox's browser tests (tests/tests/inbox.rs) drive, idempotently:
#   chromium         /usr/bin/chromium         from Debian's package `chromium`
#   chromedriver     /usr/bin/chromedriver     from Debian's package `chromium-driver`
# Both come from the same Debian source package, so their versions always match.
# DELTA_CHROMIUM / DELTA_CHROMEDRIVER point the tests at other binaries instead.
set -euo pipefail

if ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

echo "chromium:     $(command -v chromium) ($(chromium --version 2>/dev/null | head -n1))"
echo "chromedriver: $(command -v chromedriver) ($(chromedriver --version 2>/dev/null | head -n1))"
