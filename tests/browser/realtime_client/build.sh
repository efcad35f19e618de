#!/bin/sh
# Bundle the official @openai/agents-realtime SDK into one browser file for
# tests/browser/test_realtime_clients.py (no CDN: the page loads it from the test's server).
#
#   npm ci --no-audit --no-fund          # the versions pinned in package-lock.json
#   esbuild entry.mjs --bundle --format=iife --platform=browser --target=es2022 \
#       --legal-comments=none --outfile=dist/agents-realtime.js
#
# node_modules/ and dist/ are not committed (gitignored); both are kept between runs, so a
# rerun with an unchanged lockfile does nothing. Needs node and npm (`make sysdeps`).
set -eu
cd "$(dirname "$0")"
out=dist/agents-realtime.js
if [ -f "$out" ] && [ "$out" -nt package-lock.json ] && [ "$out" -nt entry.mjs ]; then
    exit 0
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
fi
node_modules/.bin/esbuild entry.mjs --bundle --format=iife --platform=browser --target=es2022 \
    --legal-comments=none --log-level=warning --outfile="$out"
