"""The agent's file watches (watch.py): create, modify, rename and delete in order, new
directories followed when recursive, a flood coalesced, the bound kept. Run with
``python3 -m unittest test_watch``; the agent's path rule (under /workspace or /tmp) holds, so
the watched directory is made under /tmp."""

import os
import shutil
import tempfile
import time
import unittest

from test_agent import AgentCase


class WatchTest(AgentCase):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(prefix="kennel-watch-test-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.root, True)

    def watch(self, recursive=True, max_watches=8):
        _, answer = self.agent.call({"op": "watch", "path": self.root, "recursive": recursive,
                                     "max_watches": max_watches})
        return answer

    def events(self, wid, start=0, until=None):
        end = time.monotonic() + 5
        while True:
            _, answer = self.agent.call({"op": "watch_read", "wid": wid, "from": start,
                                         "max_events": 100})
            self.assertEqual(answer["event"], "watch_events", answer)
            got = [(e["type"], os.path.relpath(e["path"], self.root), e.get("to"))
                   for e in answer["events"]]
            if until is None or until(got) or time.monotonic() > end:
                return got, answer
            time.sleep(0.02)

    def test_create_modify_rename_delete_come_in_order(self):
        wid = self.watch()["wid"]
        path = os.path.join(self.root, "a.txt")
        with open(path, "w") as f:
            for _ in range(100):
                f.write("x")
                f.flush()
        os.rename(path, os.path.join(self.root, "b.txt"))
        os.unlink(os.path.join(self.root, "b.txt"))
        got, _ = self.events(wid, until=lambda g: any(t == "delete" for t, _, _ in g))
        # A hundred writes are one modify.
        self.assertEqual(got, [("create", "a.txt", None), ("modify", "a.txt", None),
                               ("rename", "a.txt", os.path.join(self.root, "b.txt")),
                               ("delete", "b.txt", None)])

    def test_new_directories_are_followed_and_reads_resume(self):
        wid = self.watch()["wid"]
        os.makedirs(os.path.join(self.root, "d"))
        got, first = self.events(wid, until=lambda g: g)
        time.sleep(0.05)  # the watch on d is added as its creation is read
        open(os.path.join(self.root, "d", "f"), "w").close()
        got, _ = self.events(wid, start=first["next"], until=lambda g: g)
        self.assertEqual(got, [("create", "d/f", None)])

    def test_the_bound_and_the_path_rule_hold(self):
        self.watch(max_watches=1)
        refused = self.watch(max_watches=1)
        self.assertEqual(refused["errno"], "EAGAIN", refused)
        _, outside = self.agent.call({"op": "watch", "path": "/etc", "max_watches": 8})
        self.assertEqual(outside["errno"], "EINVAL", outside)
        _, unknown = self.agent.call({"op": "watch_read", "wid": 99, "from": 0, "max_events": 1})
        self.assertEqual(unknown["errno"], "ESRCH", unknown)


if __name__ == "__main__":
    unittest.main()
