# Drives ironic-python-agent's own download and write code, as the agent runs
# it on a host in Metal3's direct deploy: the standby extension's
# prepare_image, called with an image_info as Ironic's conductor sends it.
#
# Only the block device is stood in for: a hardware manager (IPA's own
# plugin mechanism) names a regular file (or a FIFO) as the install device.
# Everything else is IPA's code: the retries, ImageDownload, the checksum,
# the stream-or-cache decision, the write, the partition table check (parted
# on the file).
#
# Input (stdin, JSON): {"disk": path, "image_info": {...}, "conf": {opt: value},
# "result": path}. Output (JSON, in the result file; IPA logs to stderr): what IPA did, observed by wrapping its functions
# (which path ran, how many downloads it started, the bytes of each, whether
# its checksum check passed), and the command's status and error.
import faulthandler
import hashlib
import json
import os
import sys
import time

req = json.load(sys.stdin)

# A driver that hangs says where, in every thread, and ends before the Go
# side's deadline (ipa.go) kills it without a word.
faulthandler.dump_traceback_later(540, exit=True)

from oslo_config import cfg
from oslo_log import log

# IPA registers its options when its config module is imported (as its
# agent command does first); disk_utils reads them at import time.
from ironic_python_agent import config  # noqa: F401
from ironic_python_agent import disk_utils
from ironic_python_agent import hardware
from ironic_python_agent.extensions import standby

CONF = cfg.CONF
log.register_options(CONF)
CONF(args=[], project='ironic-python-agent', default_config_files=[], default_config_dirs=[])
for name, value in req.get('conf', {}).items():
    CONF.set_override(name, value)
CONF.set_override('use_stderr', True)
log.setup(CONF, 'ironic-python-agent')

seen = {'paths': [], 'downloads': [], 'verified': []}


class FileDisk(hardware.HardwareManager):
    """The host's one disk, a regular file: the only stand-in."""

    HARDWARE_MANAGER_NAME = 'FileDisk'

    def evaluate_hardware_support(self):
        return hardware.HardwareSupport.SERVICE_PROVIDER

    def get_os_install_device(self, permit_refresh=False):
        return req['disk']


hardware._global_managers = [{'name': 'FileDisk', 'manager': FileDisk(),
                              'support': hardware.HardwareSupport.SERVICE_PROVIDER}]

# The filesystem UUID of the streamed disk is read with lsblk, which only
# reads block devices; the file has none to give.
disk_utils.block_uuid = lambda dev: ''


def spy(cls, name, record):
    real = getattr(cls, name)

    def wrapper(*args, **kwargs):
        record(*args)
        return real(*args, **kwargs)
    setattr(cls, name, wrapper)


# Which path prepare_image chose: its own decision, seen from the function
# that ran.
spy(standby.StandbyExtension, '_stream_raw_image_onto_device',
    lambda *a: seen['paths'].append('stream'))
spy(standby.StandbyExtension, '_cache_and_write_image',
    lambda *a: seen['paths'].append('cache'))


class CountedDownload(standby.ImageDownload):
    """IPA's ImageDownload, counted: one per attempt that reached a server."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        seen['downloads'].append(self)

    def verify_image(self, image_location):
        super().verify_image(image_location)  # raises ImageChecksumError
        seen['verified'].append(self._hash_algo.name + ':' + self._hash_algo.hexdigest())


standby.ImageDownload = CountedDownload

ext = standby.StandbyExtension()
out = {}
try:
    cmd = ext.prepare_image(image_info=req['image_info'])
    # The command's state, not its thread's end: on a loaded machine the
    # driver once hung in join() after IPA had logged the command completed
    # (eventlet, whose hubs are per thread, had printed "cannot switch to a
    # different thread" in the command's thread): the result is complete
    # once the state is set, whatever the thread does after.
    while not cmd.is_done():
        time.sleep(0.05)
    out['status'] = str(cmd.command_status)
    err = cmd.command_error
except Exception as e:  # the validator refused the image_info
    out['status'] = 'REFUSED'
    err = e
if err is not None:
    out['error_type'] = type(err).__name__
    out['error'] = str(err)
out['paths'] = seen['paths']
out['download_bytes'] = [d.bytes_transferred for d in seen['downloads']]
out['content_lengths'] = [d.content_length for d in seen['downloads']]
out['verified'] = seen['verified']
if req.get('hash_disk'):
    h = hashlib.sha256()
    with open(req['disk'], 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    out['disk_sha256'] = h.hexdigest()
with open(req['result'] + '.part', 'w') as f:
    json.dump(out, f)
os.rename(req['result'] + '.part', req['result'])
sys.stderr.flush()
# Not the interpreter's shutdown, which joins the command's thread too.
os._exit(0)
