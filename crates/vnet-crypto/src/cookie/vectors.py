"""Known vectors for vnet's v3 MACs and cookie replies (src/cookie/tests.rs), computed apart
from the Rust code: hashlib's BLAKE2s, the `cryptography` package's X25519 and
ChaCha20-Poly1305, and HChaCha20 written out here (XChaCha20-Poly1305 = ChaCha20-Poly1305 under
HChaCha20(key, nonce[:16]) with the nonce 0[4] | nonce[16:]). Run: python3 vectors.py"""
import hashlib
import struct

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

def pub(priv):
    k = X25519PrivateKey.from_private_bytes(priv)
    return k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

def dh(priv, pubk):
    return X25519PrivateKey.from_private_bytes(priv).exchange(X25519PublicKey.from_public_bytes(pubk))

def H(*parts):
    h = hashlib.blake2s()
    for p in parts:
        h.update(p)
    return h.digest()

def MAC(key, data):
    return hashlib.blake2s(data, key=key, digest_size=16).digest()

def rotl(v, c):
    return ((v << c) & 0xffffffff) | (v >> (32 - c))


def qr(x, a, b, c, d):
    x[a] = (x[a] + x[b]) & 0xffffffff; x[d] = rotl(x[d] ^ x[a], 16)
    x[c] = (x[c] + x[d]) & 0xffffffff; x[b] = rotl(x[b] ^ x[c], 12)
    x[a] = (x[a] + x[b]) & 0xffffffff; x[d] = rotl(x[d] ^ x[a], 8)
    x[c] = (x[c] + x[d]) & 0xffffffff; x[b] = rotl(x[b] ^ x[c], 7)


def hchacha20(key, nonce16):
    x = list(struct.unpack('<4I', b'expand 32-byte k')) + list(struct.unpack('<8I', key)) + list(struct.unpack('<4I', nonce16))
    for _ in range(10):
        qr(x,0,4,8,12); qr(x,1,5,9,13); qr(x,2,6,10,14); qr(x,3,7,11,15)
        qr(x,0,5,10,15); qr(x,1,6,11,12); qr(x,2,7,8,13); qr(x,3,4,9,14)
    return struct.pack('<8I', *(x[0:4] + x[12:16]))

def xseal(key, nonce24, plain, ad):
    sub = hchacha20(key, nonce24[:16])
    return ChaCha20Poly1305(sub).encrypt(b'\0' * 4 + nonce24[16:], plain, ad)

# draft-irtf-cfrg-xchacha section 2.2.1 test vector for HChaCha20
k = bytes(range(32))
n = bytes.fromhex('000000090000004a0000000031415927')
assert hchacha20(k, n).hex() == '82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc'

a_priv = bytes(range(1, 33))
b_priv = bytes(range(101, 133))
A, B = pub(a_priv), pub(b_priv)
ss = dh(a_priv, B)
assert ss == dh(b_priv, A)
print('A_pub', A.hex())
print('B_pub', B.hex())
print('ss', ss.hex())
mac1_key_B = H(b'vnet-mac1-v3----', B)
print('mac1_key(B)', mac1_key_B.hex())
# A v3 initiation from A to B: type 6, VNI 5, sender index 9, Noise bytes 0..56.
msg = bytes([6, 0, 0, 5]) + struct.pack('<I', 9) + bytes(range(57))
m1 = MAC(mac1_key_B, msg)
secret = bytes([0x5c] * 32)
cookie = MAC(secret, A)  # B's cookie for A
m2 = MAC(cookie, msg + m1)
print('mac1', m1.hex())
print('cookie', cookie.hex())
print('mac2', m2.hex())
print('init', (msg + m1 + m2).hex())
# B's cookie reply to A, answering sender index 9: sealed under H(label | ss | B_pub)
ckey = H(b'vnet-cookie-v3--', ss, B)
print('cookie_reply_key(B)', ckey.hex())
nonce = bytes(range(200, 224))
epoch = 1_700_000_000_123_456_789
head = bytes([16, 0, 0, 5]) + struct.pack('<I', 9)  # type 16, VNI 5, receiver index 9
sealed = xseal(ckey, nonce, cookie + struct.pack('<Q', epoch), head)
print('reply', (head + nonce + sealed).hex(), len(head + nonce + sealed))
