"""Consumer groups: the classic group protocol's state machine (group), its membership protocol (membership),
committed offsets as managed-ledger cursors (offsets), KIP-848's consumer group protocol (consumer), and the
coordinator that ties them together."""
from kop.groups.coordinator import GroupCoordinator, GroupDescription, GroupListing, MemberDescription
from kop.groups.group import Group, GroupState, JoinResult, SyncResult
from kop.groups.membership import JoinRequest
from kop.groups.offsets import CommittedOffset

__all__ = ["CommittedOffset", "Group", "GroupCoordinator", "GroupDescription", "GroupListing", "GroupState",
           "JoinRequest", "JoinResult", "MemberDescription", "SyncResult"]
