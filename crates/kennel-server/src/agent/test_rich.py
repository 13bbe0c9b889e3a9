"""Tests of a session exec's rich results (rich.py, loaded by agent.py's kernel), over the
agent's JSON-lines protocol.

Run: cd crates/kennel-server/src/agent && /usr/bin/python3 -m unittest test_rich -v

matplotlib is not on this host's python; its figures are tested against the python-data
image by the server's tests (crates/kennel/tests/rich.rs).
"""

import base64
import unittest

from test_agent import AgentCase

PNG = b"\x89PNG\r\n\x1a\nnot really"


class RichTest(AgentCase):
    def rich(self, code, **kw):
        """(outputs, result, stdout, stderr) of a python session exec."""
        request = {"op": "exec", "kind": "python", "code": code, "timeout_ms": 5000,
                   "output_limit": 1 << 20, **kw}
        events, result = self.agent.call(request, timeout=15)
        self.assertEqual(result["event"], "result", result)
        outputs = [e["output"] for e in events if e["event"] == "display"]
        out = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stdout")
        err = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stderr")
        return outputs, result, out, err

    def test_the_last_expression_is_the_value(self):
        outputs, result, out, _ = self.rich("x = 6\nx * 7")
        self.assertEqual(outputs, [{"kind": "value", "data": {"text/plain": "42"}}])
        self.assertEqual((out, result["error"], result["results_truncated"]), (b"", None, False))
        outputs, _, out, _ = self.rich("print('a')\n'text'")
        self.assertEqual((out, outputs[0]["data"]), (b"a\n", {"text/plain": "'text'"}))

    def test_no_value_for_none_statements_or_a_semicolon(self):
        for code in ("None", "x = 1", "print(1)", "6 * 7;", "6 * 7 ;  # hidden", "if True:\n    5"):
            outputs, result, _, _ = self.rich(code)
            self.assertEqual(outputs, [], code)
            self.assertEqual(result["exit_code"], 0, code)

    def test_display_speaks_the_display_protocol_in_order(self):
        code = '''
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": "<i>b</i>", "application/vnd.custom+json": {"k": [1]}}, {"meta": 1}
    def _repr_html_(self):
        return "not used: the bundle has html"
class Each:
    def _repr_html_(self): return "<b>e</b>"
    def _repr_markdown_(self): return "*e*"
    def _repr_json_(self): return {"a": 1}, {"expanded": True}
    def _repr_png_(self): return PNG
    def _repr_svg_(self): return "<svg/>"
    def _repr_latex_(self): return None
    def __repr__(self): return "Each()"
display(Bundle(), Each())
display(3)
Each
'''
        outputs, result, _, err = self.rich(f"PNG = {PNG!r}\n{code}")
        self.assertEqual(err, b"")
        self.assertEqual([o["kind"] for o in outputs], ["display", "display", "display", "value"])
        bundle, each, three, klass = (o["data"] for o in outputs)
        self.assertEqual(bundle["text/html"], "<i>b</i>")
        self.assertEqual(bundle["application/vnd.custom+json"], {"k": [1]})
        self.assertTrue(bundle["text/plain"].startswith("<__main__.Bundle object"))
        self.assertEqual(each, {
            "text/plain": "Each()", "text/html": "<b>e</b>", "text/markdown": "*e*",
            "application/json": {"a": 1}, "image/png": base64.b64encode(PNG).decode(),
            "image/svg+xml": "<svg/>",
        })
        self.assertEqual(three, {"text/plain": "3"})
        # A class is shown by its repr: its _repr_*_ are functions, not its own.
        self.assertEqual(klass, {"text/plain": "<class '__main__.Each'>"})

    def test_prints_and_rich_outputs_keep_the_order_the_code_made_them_in(self):
        request = {"op": "exec", "kind": "python", "output_limit": 1 << 20, "timeout_ms": 5000,
                   "code": "for i in range(30):\n    print(i, end='')\n    display(i)\n'end'"}
        events, _ = self.agent.call(request, timeout=15)
        seen = [base64.b64decode(e["b64"]).decode() if e["event"] == "stdout"
                else e["output"]["data"]["text/plain"] for e in events]
        self.assertEqual(seen, [str(i) for i in range(30) for _ in (0, 1)] + ["'end'"])

    def test_a_failing_repr_method_is_said_and_skipped(self):
        code = "class A:\n def _repr_html_(self): raise RuntimeError('no html')\n def __repr__(self): return 'A!'\nA()"
        outputs, result, _, err = self.rich(code)
        self.assertEqual(outputs, [{"kind": "value", "data": {"text/plain": "A!"}}])
        self.assertIn(b"A._repr_html_ failed: RuntimeError('no html')", err)
        self.assertEqual(result["exit_code"], 0)

    def test_errors_are_data_and_the_session_lives_on(self):
        outputs, result, _, err = self.rich("y = 5\ndef f():\n    return 1 / 0\nf()")
        self.assertEqual(outputs, [])
        self.assertEqual(result["exit_code"], 1)
        error = result["error"]
        self.assertEqual((error["name"], error["value"]), ("ZeroDivisionError", "division by zero"))
        self.assertEqual(error["traceback"], [
            "Traceback (most recent call last):",
            '  File "<session>", line 4, in <module>',
            '  File "<session>", line 3, in f',
            "ZeroDivisionError: division by zero",
        ])
        self.assertEqual(err.decode().splitlines(), error["traceback"])
        outputs, result, _, _ = self.rich("y + 1")
        self.assertEqual((outputs[0]["data"]["text/plain"], result["error"]), ("6", None))

    def test_a_syntax_error_is_data_without_kernel_frames(self):
        _, result, _, err = self.rich("1 +")
        self.assertEqual(result["error"]["name"], "SyntaxError")
        self.assertNotIn(b"kennel", err)
        self.assertIn('File "<session>", line 1', result["error"]["traceback"][0])

    def test_exit_is_not_an_error(self):
        _, result, _, _ = self.rich("import sys; sys.exit(4)")
        self.assertEqual((result["exit_code"], result["error"]), (4, None))

    def test_an_interrupt_at_the_timeout_is_an_error_too(self):
        _, result, _, _ = self.rich("import time\nwhile True: time.sleep(0.01)", timeout_ms=300)
        self.assertTrue(result["timed_out"])
        self.assertEqual(result["error"]["name"], "KeyboardInterrupt")
        outputs, _, _, _ = self.rich("2")
        self.assertEqual(outputs[0]["data"], {"text/plain": "2"})

    def test_outputs_are_capped_by_count_and_by_the_output_limit(self):
        outputs, result, _, _ = self.rich("for i in range(100): display(i)")
        self.assertEqual([o["data"]["text/plain"] for o in outputs], [str(i) for i in range(64)])
        self.assertTrue(result["results_truncated"])
        outputs, result, _, _ = self.rich(
            "display('a' * 300)\ndisplay('b' * 3000)\n'c' * 300", output_limit=1000
        )
        self.assertEqual([len(o["data"]["text/plain"]) for o in outputs], [302, 302])
        self.assertTrue(result["results_truncated"])
        _, result, _, _ = self.rich("def f(n): return f(n + 1)\nf(0)", output_limit=2000)
        error = result["error"]
        self.assertEqual(error["name"], "RecursionError")
        self.assertLessEqual(sum(len(line) + 1 for line in error["traceback"]), 2000)
        self.assertEqual(error["traceback"][0], "Traceback (most recent call last):")
        self.assertTrue(error["traceback"][-1].startswith("RecursionError"))

    def test_figure_formats_are_checked(self):
        request = {"op": "exec", "kind": "python", "code": "1", "timeout_ms": 5000,
                   "output_limit": 100, "figure_formats": ["gif"]}
        _, final = self.agent.call(request)
        self.assertEqual((final["event"], final["errno"]), ("error", "EINVAL"))

    def test_lone_surrogates_do_not_break_the_protocol(self):
        outputs, result, _, _ = self.rich(
            "class S:\n def _repr_html_(self): return '\\ud800'\ndisplay(S())\nraise ValueError('\\udcff')"
        )
        self.assertEqual(outputs[0]["data"]["text/html"], "?")
        self.assertEqual(result["error"]["value"], "?")

    def test_a_one_shot_run_has_no_rich_results_and_never_loads_them(self):
        code = "import sys, builtins\nprint('ast' in sys.modules, hasattr(builtins, 'display'))\n6 * 7"
        outputs, result, out, _ = self.rich(code, one_shot=True)
        self.assertEqual((outputs, out), ([], b"False False\n"))
        self.assertNotIn("error", result)
        _, result, _, err = self.rich("1 / 0", one_shot=True)
        self.assertNotIn("error", result)
        self.assertIn(b'File "<string>", line 1', err)


if __name__ == "__main__":
    unittest.main()
