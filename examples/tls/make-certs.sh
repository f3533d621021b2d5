#!/usr/bin/env bash
# Makes a throwaway certificate authority and the certificates the TLS example
# uses, with openssl. For trying mefor out only: the CA key is unprotected and
# everything expires in 30 days. In production your organisation's (or each
# partner's) CA issues these.
#
#   bash examples/tls/make-certs.sh [DIR]              # default DIR: out/tls
#   bash examples/tls/make-certs.sh DIR renew-node     # re-issue node.crt/.key only, same CA
#
# DIR then holds, each certificate with its key (mode 600):
#   ca.crt              the CA every party here trusts
#   node.crt/.key       the mefor node: its listener's certificate, and its client
#                       certificate towards the lab (CN=mefor-node)
#   sender.crt/.key     the registration system sending ADT to mefor (CN=registration)
#   sink.crt/.key       the lab system mefor delivers to (CN=lab-system)
#   stranger.crt/.key   signed by another CA, to see a sender refused
set -euo pipefail

dir=${1:-out/tls}
days=30
mkdir -p "$dir"
cd "$dir"
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# issue NAME CN EXTENDED_KEY_USAGE CA_NAME: a key and a certificate signed by CA_NAME,
# valid for localhost and 127.0.0.1 (where the example runs).
issue() {
	local name=$1 cn=$2 eku=$3 ca=$4
	key "$name.key"
	openssl req -new -key "$name.key" -subj "/O=mefor example/CN=$cn" -out "$name.csr"
	cat >"$name.ext" <<EXT
basicConstraints = CA:FALSE
keyUsage = digitalSignature
extendedKeyUsage = $eku
subjectAltName = DNS:localhost, IP:127.0.0.1
EXT
	openssl x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial \
		-days "$days" -sha256 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
	rm -f "$name.csr" "$name.ext"
}

ca() {
	key "$1.key"
	openssl req -x509 -new -key "$1.key" -subj "/O=mefor example/CN=$2" -days "$days" -sha256 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$1.crt"
}

if [ "${2:-}" = renew-node ]; then
	# Written beside the old files and renamed over them, as a renewal tool
	# does, so a node never reads half a file.
	issue node.new mefor-node serverAuth,clientAuth ca
	mv node.new.key node.key
	mv node.new.crt node.crt
	rm -f ./*.srl
	chmod 644 node.crt
	echo "renewed $dir/node.crt: $(openssl x509 -in node.crt -noout -serial -enddate | tr '\n' ' ')"
	exit 0
fi

ca ca "mefor example CA"
issue node mefor-node serverAuth,clientAuth ca
issue sender registration clientAuth ca
issue sink lab-system serverAuth,clientAuth ca
ca other-ca "someone else's CA"
issue stranger stranger clientAuth other-ca
rm -f ./*.srl other-ca.key
chmod 644 ./*.crt

echo "certificates in $dir (valid $days days):"
for c in ca node sender sink stranger; do
	printf '  %-14s %s, expires %s\n' "$c.crt" "$(openssl x509 -in "$c.crt" -noout -subject -nameopt RFC2253 | sed 's/^subject=//')" \
		"$(openssl x509 -in "$c.crt" -noout -enddate | sed 's/^notAfter=//')"
done
