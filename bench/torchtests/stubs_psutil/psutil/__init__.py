"""Stand-in for `psutil`, for running PyTorch's test/test_cuda.py on a
machine that lacks it. run.sh puts this directory on PYTHONPATH only when
`import psutil` fails there.

test_cuda.py imports psutil at the top and uses it in one place, TestGDS's
_get_tmp_dir_fs_type (psutil.disk_partitions), whose only caller is a test
marked @unittest.skip. This module provides disk_partitions from
/proc/mounts; any other attribute raises AttributeError naming this
stand-in, so code that probes for psutil fails loudly, the same way under
every allocator, rather than silently getting a wrong answer.
"""

import collections

STAND_IN = True

sdiskpart = collections.namedtuple("sdiskpart", "device mountpoint fstype opts")


def disk_partitions(all=False):
    parts = []
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4:
                parts.append(sdiskpart(fields[0], fields[1].replace("\\040", " "), fields[2], fields[3]))
    return parts


def __getattr__(name):
    raise AttributeError(
        f"psutil.{name}: not provided by the psutil stand-in of bench/torchtests "
        "(install psutil for the real one)")
