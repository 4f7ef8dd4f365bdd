"""StarCluster plugin: install aepar once on the master's NFS-shared /home.

Referenced from config.template as ``SETUP_CLASS = aepar_plugin.AeparInstaller``; copy this
file to ~/.starcluster/plugins/. StarCluster itself is Python 2.7 software, so this file
keeps to syntax that Python 2.7 and 3 both accept. Untested here (it needs EC2).
"""
from starcluster.clustersetup import ClusterSetup
from starcluster.logger import log


class AeparInstaller(ClusterSetup):
    """Clone aepar into ``dest`` as the cluster user and build its .venv (``make venv``)."""

    def __init__(self, repo_url, branch="main", dest="/home/sgeadmin/aepar"):
        super(AeparInstaller, self).__init__()
        self.repo_url, self.branch, self.dest = repo_url, branch, dest

    def run(self, nodes, master, user, user_shell, volumes):
        log.info("aepar: cloning %s (%s) into %s on the master" % (self.repo_url, self.branch, self.dest))
        q = lambda s: "'" + s.replace("'", "'\\''") + "'"
        script = ("set -e; if [ ! -d %s/.git ]; then git clone --branch %s %s %s; fi; "
                  "cd %s && git pull --ff-only && make venv"
                  % (q(self.dest), q(self.branch), q(self.repo_url), q(self.dest), q(self.dest)))
        master.ssh.execute("su - %s -c %s" % (user, q(script)))
        log.info("aepar: ready; submit with: cd %s && qsub jobs/starcluster/sparse_scaling.sge" % self.dest)
