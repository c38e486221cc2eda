#!/usr/bin/env bash
# Makes playwright-core (npm) available for the console's browser test, outside the repository:
# installs it on demand into a cache directory and prints the node_modules directory that holds
# it. The browser is Debian's Chromium (/usr/bin/chromium), never one Playwright downloads.
#
#   scripts/playwright.sh            prints e.g. /root/.cache/idemkafka-npm/node_modules
#
# Environment: IDEMKAFKA_NPM_CACHE (default ~/.cache/idemkafka-npm). Missing node, npm or
# chromium are installed from Debian's packages (as root; otherwise the command is printed).
set -euo pipefail

IK_NO_TRAP=1
# shellcheck source=scripts/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

version=1.65.2
cache="${IDEMKAFKA_NPM_CACHE:-$HOME/.cache/idemkafka-npm}"

ik_ensure_browser_tools >&2
mkdir -p "$cache"
# One install at a time: tests may ask side by side.
exec 9>"$cache/.lock"
flock -w 600 9 || ik_die "another install into $cache holds its lock for 10 minutes"
installed="$cache/node_modules/playwright-core/package.json"
if ! [ -f "$installed" ] || ! grep -q "\"version\": \"$version\"" "$installed"; then
    ik_log "installing playwright-core $version into $cache" >&2
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$cache" --no-save --no-audit --no-fund \
        --loglevel=error "playwright-core@$version" >&2 ||
        ik_die "npm could not install playwright-core $version into $cache"
fi
printf '%s\n' "$cache/node_modules"
