package hostile

import "testing"

// templateDiffers: the native-template backend's root is a template's
// (testutil.SuiteTemplateRoot: the host's python3 and a few programs
// under a layer of hostile links), writable by the sandbox's root into a
// layer of its own, and without the host's other files.
const templateDiffers = "the root is a template's layers under the sandbox's own writable layer, not the host's read-only /usr: "

// templateDifferences are where a template's sandbox's safe outcome is
// not the native one's.
var templateDifferences = map[string]difference{
	// Its user meets the permissions of files its root owns, where the
	// host's /usr is a read-only mount; the host's files are never
	// reached.
	"write_read_only_root": {why: templateDiffers + "its user meets the permissions (EACCES), not a read-only mount",
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("append /etc/passwd EACCES", "create /etc/cron.d/evil ENOENT",
				"create /usr/bin/evil EACCES", "create /usr/lib/python3/dist-packages/evil.pth ENOENT",
				"overwrite the runner EROFS", "overwrite python EACCES", "mkdir /evil EACCES",
				"unlink /etc/hosts EACCES", "rename /etc/passwd EACCES", "symlink in / EACCES",
				"write /var/evil EACCES"))
			for _, p := range []string{"/usr/bin/evil", "/evil", "/var/evil"} {
				hostFileAbsent(t, p)
			}
		}},
	"change_host_file_metadata": {why: templateDiffers + "its user meets the permissions (EPERM, EACCES)",
		check: want("chmod su EPERM", "chown passwd EPERM", "utime python EPERM", "truncate os.py EACCES",
			"setxattr EACCES", "chmod workspace root EPERM")},
	"host_users_and_groups": {why: templateDiffers + "its users are the image's (none here) and the sandbox's",
		check: want("['sandbox']", "['sandbox']", "sandbox")},
	"setuid_binaries_and_sudo": {why: templateDiffers + "the image has su and no other set-ID program; its layers " +
		"are mounted nosuid", check: want("usr nosuid True", "sudo None doas None pkexec None", "su failed",
		"mount absent", "newgrp absent", "passwd absent", "chsh absent", "root seen False")},
	// Nothing of the host's to attack.
	"disk_read_hog": {why: templateDiffers + "the host's large file the case reads is not in the template"},
	"take_all_inotify_watches": {why: templateDiffers + "the template has fewer files than the watch budget; " +
		"the budget is the user namespace's, as in every sandbox"},
}
