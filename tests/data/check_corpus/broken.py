def broken(:
    x = torch.zeros(3).cuda()  # expect: ANY005
    # a cuda comment is not a finding
    return x
