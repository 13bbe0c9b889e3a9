import binascii, marshal, sys, zlib
from _frozen_importlib_external import MAGIC_NUMBER
code = compile(sys.stdin.read(), "<string>", "exec")
raw = zlib.compress(MAGIC_NUMBER + marshal.dumps(code), 9)
sys.stdout.write(binascii.b2a_base64(raw, newline=False).decode())
