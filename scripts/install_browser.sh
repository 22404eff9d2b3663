#!/usr/bin/env bash
# Debian's Chromium for the browser tests (tests/test_browser.py). Playwright drives it through
# executable_path and never downloads a browser. Where apt-get is missing or not ours to run,
# nothing is installed and those tests skip, saying why.
set -uo pipefail
if command -v chromium >/dev/null; then
  echo "chromium present: $(chromium --version 2>/dev/null)"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    && echo "chromium installed: $(chromium --version 2>/dev/null)" \
    || echo "chromium could not be installed: the browser tests will skip"
else
  echo "no apt-get as root here: the browser tests will skip (install chromium to run them)"
fi
