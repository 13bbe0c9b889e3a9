"""A request's ``user`` in the agent (agent.py's "Users"): shell execs, python execs (a kernel
of its own) and background processes as uid 1000, with its groups, HOME, USER and LOGNAME; the
refusal where uid 1000 cannot be had; and a user site that appears after the kernel started.
Run with ``python3 -m unittest test_users``.

Bare on the host the agent is the host's root, so uid 1000 here is the host's own: these tests
only run ``id`` and read files as it. They need root (they fail under ``CI=true`` without it,
and skip otherwise); the refusal runs the agent in a user namespace that maps one id
(``unshare --map-root-user``), as a non-root supervisor's sandbox does.
"""

import base64
import os
import shutil
import subprocess
import unittest

import test_agent
from test_agent import AgentCase, AgentProcess


def need_root():
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            raise AssertionError("the user tests need root (uid 1000 must be switched to)")
        raise unittest.SkipTest("not root: uid 1000 cannot be switched to")


class UserTest(AgentCase):
    helpers = test_agent.AgentTest  # its helpers, not its tests
    exec, shell, python = helpers.exec, helpers.shell, helpers.python

    def setUp(self):
        need_root()
        super().setUp()
        os.chmod(self.dir, 0o755)  # uid 1000's cwd: the test's directory

    def test_a_user_shell_exec_runs_as_1000_without_groups_with_its_home(self):
        script = 'id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"'
        result, out, err = self.shell(script, user="user")
        self.assertEqual((result["exit_code"], err), (0, b""))
        self.assertEqual(out, b"1000\n1000\n1000\n/workspace user user\n")
        _, out, _ = self.shell("id -u")
        self.assertEqual(out, b"0\n")

    def test_each_user_keeps_its_own_shell_state(self):
        self.shell("cd /tmp && export SEEN=user", user="user", cwd=None)
        self.shell("export SEEN=root", cwd=None)
        _, out, _ = self.shell('pwd; echo "$SEEN"; id -u', user="user", cwd=None)
        self.assertEqual(out, b"/tmp\nuser\n1000\n")
        _, out, _ = self.shell('pwd; echo "$SEEN"', cwd=None)
        self.assertEqual(out, f"{self.dir}\nroot\n".encode())

    def test_user_python_has_a_kernel_of_its_own_beside_the_default_one(self):
        self.python("x = 'root'")
        result, out, _ = self.python(
            "import os\nx = 'user'\nprint(os.getuid(), os.getgid(), os.getgroups(), "
            "os.environ['HOME'], os.environ['USER'])", user="user")
        self.assertEqual(out, b"1000 1000 [] /workspace user\n", result)
        _, out, _ = self.python("import os; print(os.getuid(), x)")
        self.assertEqual(out, b"0 root\n")
        _, out, _ = self.python("print(x)", user="user")
        self.assertEqual(out, b"user\n")

    def test_a_user_process_runs_as_1000(self):
        _, started = self.agent.call({"op": "start", "argv": ["sh", "-c", "id -u; echo $HOME"],
                                      "max_processes": 4, "user": "user", "cwd": self.dir})
        self.assertEqual(started["event"], "started", started)
        pid = started["pid"]
        for _ in range(500):
            _, answer = self.agent.call({"op": "proc_read", "pid": pid, "stdout_offset": 0,
                                         "stderr_offset": 0, "max_bytes": 100})
            if answer["ended"]:
                break
        self.assertEqual(base64.b64decode(answer["stdout"]["b64"]), b"1000\n/workspace\n")

    def test_an_unknown_user_is_refused(self):
        _, answer = self.agent.call({"op": "exec", "kind": "shell", "command": "true",
                                     "timeout_ms": 1000, "output_limit": 10, "user": "root"})
        self.assertEqual((answer["event"], answer["errno"]), ("error", "EINVAL"), answer)
        self.assertIn("'user'", answer["message"])


class UserSiteTest(AgentCase):
    """A package put in the user site after the kernel started imports in the next exec, .pth
    files processed: each kernel adds it (``site.addsitedir``) once it exists."""

    def setUp(self):
        super().setUp()
        self.agent.close()
        env = {**os.environ, "HOME": self.dir}
        env.pop("PYTHONUSERBASE", None)
        self.agent = AgentProcess(self.dir, env=env)
        self.addCleanup(self.agent.close)

    def python(self, code):
        events, result = self.agent.call({"op": "exec", "kind": "python", "code": code,
                                          "timeout_ms": 5000, "output_limit": 1 << 16})
        out = b"".join(base64.b64decode(e["b64"]) for e in events if e["event"] == "stdout")
        return result, out

    def test_a_user_site_made_later_is_imported_with_its_pth(self):
        _, out = self.python("import site; print(site.getusersitepackages())")
        user_site = out.decode().strip()
        self.assertTrue(user_site.startswith(self.dir), user_site)
        extra = os.path.join(self.dir, "extra")
        os.makedirs(user_site)
        os.makedirs(extra)
        with open(os.path.join(user_site, "late_pkg.py"), "w") as f:
            f.write("VALUE = 41\n")
        with open(os.path.join(user_site, "late.pth"), "w") as f:
            f.write(extra + "\n")
        with open(os.path.join(extra, "via_pth.py"), "w") as f:
            f.write("VALUE = 1\n")
        result, out = self.python("import late_pkg, via_pth; print(late_pkg.VALUE + via_pth.VALUE)")
        self.assertEqual(out, b"42\n", result)


class UserRefusedTest(unittest.TestCase):
    """In a user namespace that maps one id there is no uid 1000: a ``user`` exec, python exec
    or process is refused with EPERM naming ``user``, starts nothing, and the agent goes on."""

    def setUp(self):
        unshare = shutil.which("unshare")
        probe = unshare and subprocess.run([unshare, "--user", "--map-root-user", "true"],
                                           capture_output=True)
        if not probe or probe.returncode != 0:
            if os.environ.get("CI") == "true":
                raise AssertionError("unshare --map-root-user does not work here")
            raise unittest.SkipTest("no unprivileged user namespace (unshare --map-root-user)")
        self.agent = AgentProcess("/tmp", wrapper=(unshare, "--user", "--map-root-user"))
        self.addCleanup(self.agent.close)

    def test_user_is_refused_with_eperm_and_the_agent_goes_on(self):
        base = {"timeout_ms": 5000, "output_limit": 100}
        for request in (
            {"op": "exec", "kind": "shell", "command": "touch /tmp/never", **base},
            {"op": "exec", "kind": "python", "code": "print(1)", **base},
            {"op": "start", "argv": ["true"], "max_processes": 4},
        ):
            _, answer = self.agent.call({**request, "user": "user"})
            self.assertEqual((answer["event"], answer["errno"]), ("error", "EPERM"), answer)
            self.assertEqual(answer["message"], "`user` is refused here: the sandbox's user "
                             "namespace has no uid and gid 1000")
        events, result = self.agent.call({"op": "exec", "kind": "shell", "command": "id -u",
                                          **base})
        self.assertEqual(base64.b64decode(events[0]["b64"]), b"0\n", result)


if __name__ == "__main__":
    unittest.main()
