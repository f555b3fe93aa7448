"""DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51), v0 only, flexible. Version notes:
an upsertion carries the salt, the iteration count and the salted password the client computed (never the
password); a deletion names the user and mechanism. Results are per user; a user named twice in one request gets
DUPLICATE_RESOURCE for all its entries, as Kafka answers. Describing needs DESCRIBE on the cluster, altering ALTER;
without the authorizer, a super user (super.users)."""
import logging
from collections.abc import Awaitable

from kafka.protocol.admin.users import (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
                                        DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse)

from kop.handlers.context import RequestContext
from kop.security.acls import Operation
from kop.security.users import MECHANISM_IDS, CredentialError, ScramCredential, check_credential
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)
MECHANISM_NAMES = {number: name for name, number in MECHANISM_IDS.items()}


async def describe(ctx: RequestContext, request: DescribeUserScramCredentialsRequest):
    cls = DescribeUserScramCredentialsResponse[ctx.version]
    Result = cls.DescribeUserScramCredentialsResult
    if not ctx.may_manage_users(Operation.DESCRIBE):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                   error_message="describing SCRAM credentials needs DESCRIBE on the cluster (a super user "
                                 "without the authorizer)", results=[])
    stored = ctx.users.users()
    wanted = [user.name for user in request.users] if request.users else list(stored)
    results = []
    for name in wanted:
        if wanted.count(name) > 1:
            results.append(Result(user=name, error_code=ErrorCode.DUPLICATE_RESOURCE,
                                  error_message=f"user {name} named more than once", credential_infos=[]))
        elif name not in stored:
            results.append(Result(user=name, error_code=ErrorCode.RESOURCE_NOT_FOUND,
                                  error_message=f"no SCRAM credential for user {name}", credential_infos=[]))
        else:
            infos = [Result.CredentialInfo(mechanism=MECHANISM_IDS[c.mechanism], iterations=c.iterations)
                     for c in stored[name]]
            results.append(Result(user=name, error_code=ErrorCode.NONE, error_message=None, credential_infos=infos))
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, results=results)


async def alter(ctx: RequestContext, request: AlterUserScramCredentialsRequest):
    cls = AlterUserScramCredentialsResponse[ctx.version]
    Result = cls.AlterUserScramCredentialsResult
    names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    if not ctx.may_manage_users(Operation.ALTER):
        return cls(throttle_time_ms=0, results=[
            Result(user=name, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                   error_message="altering SCRAM credentials needs ALTER on the cluster (a super user without the "
                                 "authorizer)") for name in dict.fromkeys(names)])
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for name in names:
        if names.count(name) > 1:
            errors.setdefault(name, (ErrorCode.DUPLICATE_RESOURCE, f"user {name} named more than once"))
    for deletion in request.deletions:
        mechanism = MECHANISM_NAMES.get(deletion.mechanism)
        if deletion.name in errors:
            continue
        if mechanism is None:
            errors[deletion.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"unknown mechanism {deletion.mechanism}")
        elif ctx.users.credential(deletion.name, mechanism) is None:
            errors[deletion.name] = (ErrorCode.RESOURCE_NOT_FOUND, f"no {mechanism} credential for {deletion.name}")
    upserts = []
    for upsertion in request.upsertions:
        mechanism = MECHANISM_NAMES.get(upsertion.mechanism)
        if upsertion.name in errors:
            continue
        if mechanism is None:
            errors[upsertion.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                      f"unknown mechanism {upsertion.mechanism}")
            continue
        try:
            check_credential(upsertion.name, mechanism, upsertion.iterations)
        except CredentialError as exc:
            errors[upsertion.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
            continue
        upserts.append((upsertion.name, ScramCredential.from_salted_password(
            mechanism, upsertion.iterations, bytes(upsertion.salt), bytes(upsertion.salted_password))))
    for deletion in request.deletions:
        if deletion.name not in errors:
            await _stored(errors, deletion.name, ctx.users.delete(deletion.name, MECHANISM_NAMES[deletion.mechanism]))
    for name, credential in upserts:
        if name not in errors:
            await _stored(errors, name, ctx.users.put(name, [credential]))
    return cls(throttle_time_ms=0, results=[
        Result(user=name, error_code=errors.get(name, (ErrorCode.NONE, None))[0],
               error_message=errors.get(name, (ErrorCode.NONE, None))[1]) for name in dict.fromkeys(names)])


async def _stored(errors: dict[str, tuple[ErrorCode, str]], name: str, change: Awaitable) -> None:
    try:
        await change
    except OSError as exc:
        log.error("SCRAM credentials of %s not stored: %s", name, exc)
        errors[name] = (ErrorCode.UNKNOWN_SERVER_ERROR, f"not stored: {exc}")


ROUTES = [(DescribeUserScramCredentialsRequest.API_KEY, 0, 0, describe),
          (AlterUserScramCredentialsRequest.API_KEY, 0, 0, alter)]
