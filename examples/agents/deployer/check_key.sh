#!/bin/sh
# Reads an API key on stdin and prints only a masked fingerprint of it, never the key.
key=$(cat)
length=$(printf '%s' "$key" | wc -c | tr -d ' ')
if [ "$length" -lt 8 ]; then
  echo "the API key is too short ($length characters, at least 8 expected)" >&2
  exit 2
fi
fingerprint=$(printf '%s' "$key" | sha256sum | cut -c1-12)
echo "API key accepted: ****** ($length characters, sha256 $fingerprint)"
