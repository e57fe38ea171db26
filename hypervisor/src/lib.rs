//! KVM: the only crate that talks to /dev/kvm.
