#!/usr/bin/env bash
# deploy/make-certs.sh DIR: TLS material for a cluster on this machine (local-cluster.sh --secure,
# quickstart.sh --secure) and for the tests (openssl CLI): a private CA and certificates for
# 127.0.0.1/localhost. Not for servers other machines reach: their certificates must name them.
#
#   DIR/ca.pem, ca.key             a test CA
#   DIR/server.pem, server.key     signed by it, for CN and SAN "localhost" and IP 127.0.0.1
#   DIR/client.pem, client.key     a client certificate signed by it (mutual TLS)
#   DIR/other-ca.pem, other-ca.key another CA, which signed nothing here (a client that trusts
#                                  only it must fail to verify the server)
# EC P-256 keys, valid EMBER_CERT_DAYS days (default 1). Exit status non-zero when openssl fails.
set -euo pipefail
d=${1:?usage: make-certs.sh DIR}
days=${EMBER_CERT_DAYS:-1}
mkdir -p "$d"
cd "$d"
ossl() { openssl "$@" 2>/dev/null; }
ca() { # name subject
  ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -subj "/CN=$2" -keyout "$1.key" -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() { # name subject extensions
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" >"$1.ext"
  ossl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}
ca ca "EmberPS test CA"
ca other-ca "EmberPS other CA"
leaf server localhost "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client "emberps-test-client" "extendedKeyUsage=clientAuth"
chmod 600 ./*.key
