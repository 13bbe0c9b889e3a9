import os
def _kennel_boot():
    def read(n):
        got = b""
        while len(got) < n:
            try:
                chunk = os.read(0, n - len(got))
            except BlockingIOError:
                import select
                select.select([0], [], [])
                continue
            if not chunk:
                raise SystemExit("kennel agent: stdin ended before the agent came")
            got += chunk
        return got
    head = read(HEAD)
    fields = read(int(head[-SIZE - 2:-2])).split(b'"')
    import binascii, marshal
    if fields[3]:
        import zlib
        from _frozen_importlib_external import MAGIC_NUMBER
        raw = zlib.decompress(binascii.a2b_base64(fields[3]))
        if raw[:4] == MAGIC_NUMBER:
            return marshal.loads(raw[4:])
    return compile(binascii.a2b_base64(fields[7]), "<string>", "exec")
exec(_kennel_boot())
