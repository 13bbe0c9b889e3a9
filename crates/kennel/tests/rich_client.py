"""Rich results through the Python SDK and through MCP (PyPI `mcp`), against a running
`kennel serve` whose sessions may use the python-data image.

Usage: /usr/bin/python3 rich_client.py URL  (with sdk/python on PYTHONPATH)
Prints one line per check; exits non-zero (with a traceback) on the first failure.
"""

import asyncio
import os
import sys
import tempfile

import kennel

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEMO = "import matplotlib.pyplot as plt; plt.plot([1,2]); plt.show(); 6*7"


def sdk_checks(url):
    client = kennel.Client(url)
    with client.session(image="python-data") as s:
        r = s.run_code(DEMO)
        assert r.ok and r.error is None, r
        assert [o.kind for o in r.results] == ["display", "value"], r.results
        figure, value = r.results
        assert figure.png.startswith(PNG_MAGIC) and figure.text.startswith("<Figure"), figure
        assert value.text == "42" and r.value is value and value.png is None, value
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plot.png")
            assert figure.save(path) == "image/png"
            with open(path, "rb") as f:
                assert f.read() == figure.png
        print("ok   sdk: one png and the value 42")

        with s.stream(DEMO, figure_formats=["svg"]) as stream:
            pieces = list(stream)
        shown = [p for p in pieces if isinstance(p, kennel.RichOutput)]
        assert [p.kind for p in shown] == ["display", "value"], pieces
        assert shown[0].svg.lstrip().startswith("<?xml") and shown[0].png is None, shown[0]
        assert [o.raw for o in stream.result.results] == [p.raw for p in shown]
        print("ok   sdk stream: the rich outputs as they come, then the result")

        r = s.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert "<table" in r.value.html and "a" in r.value.text, r.value
        r = s.run_code("1 / 0")
        assert (r.error.name, r.error.value) == ("ZeroDivisionError", "division by zero"), r.error
        assert r.error.traceback[-1] == "ZeroDivisionError: division by zero", r.error
        assert s.run_code("6 * 7").value.text == "42"
        print("ok   sdk: a DataFrame's html, errors as data, the session usable after")


async def mcp_checks(url):
    from mcp import ClientSession
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with create_mcp_http_client() as http:
        async with streamable_http_client(url + "/mcp", http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                r = await s.call_tool("create_session", {"image": "python-data"})
                sid = r.structured_content["session_id"]
                r = await s.call_tool(
                    "session_exec", {"session_id": sid, "language": "python", "code": DEMO})
                assert not r.is_error, r
                images = [c for c in r.content if c.type == "image"]
                texts = [c.text for c in r.content if c.type == "text"]
                assert len(images) == 1 and images[0].mime_type == "image/png", r.content
                assert images[0].data.startswith("iVBORw0KGgo"), images[0].data[:20]
                assert len(texts) == 1 and "\nvalue: 42" in texts[0], texts
                assert "(image/png attached)" in texts[0] and len(texts[0]) < 2000, texts[0]
                data = r.structured_content["results"][0]["data"]
                assert data["image/png"] == "(sent as image content)", data
                await s.call_tool("close_session", {"session_id": sid})
                print("ok   mcp: the figure as image content, the value in short text")


def main(url):
    sdk_checks(url)
    asyncio.run(mcp_checks(url))


if __name__ == "__main__":
    main(sys.argv[1])
