#!/bin/sh
# deploy.sh <env> <version>: a stand-in for a real deploy. It records the deploy in
# deployments.log (in the work directory) so that you can see what ran, and what did not.
env="$1"
version="$2"
if [ -z "$env" ] || [ -z "$version" ]; then
  echo "usage: deploy.sh <env> <version>" >&2
  exit 64
fi
echo "$env $version" >> deployments.log
echo "deployed $version to $env"
