"""Writes the small snapshots in this directory from the real one in
testdata/fixtures, for the tests of gpumem import (cli/import_test.go):

    two_devices.pickle  device 0: the fixture's history from entry 1500 on
                        (as if the ring buffer had wrapped) and its segments;
                        device 1: no history; device 2: the fixture's first
                        200 entries, no segments
    no_history.pickle   two devices, neither with a history

Run from the repository root: python3 testdata/snapshots/make_snapshots.py
The pickles are written as torch.cuda.memory._dump_snapshot writes them
(protocol 4), so the output is the same for the same Python version.
"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "resnet18_snapshot.pickle")


def write(name, snapshot):
    with open(os.path.join(HERE, name), "wb") as f:
        pickle.dump(snapshot, f, protocol=4)


def main():
    with open(FIXTURE, "rb") as f:
        full = pickle.load(f)
    history = full["device_traces"][0]
    write("two_devices.pickle", {
        "segments": full["segments"],
        "device_traces": [history[1500:], [], history[:200]],
        "allocator_settings": full["allocator_settings"],
        "external_annotations": [],
    })
    write("no_history.pickle", {
        "segments": [],
        "device_traces": [[], []],
        "allocator_settings": full["allocator_settings"],
        "external_annotations": [],
    })


if __name__ == "__main__":
    main()
